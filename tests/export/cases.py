"""Built-in combinations sampled for export tests: every value of every kind appears with every
architecture that uses it, with grouped, multi-query and full KV heads."""

from __future__ import annotations

from tests.combinations import (
    ATTENTION,
    BLOCKS,
    FEEDFORWARD,
    NORMS,
    POSITIONAL,
    QK_NORMS,
    tiny_config,
)

KV_HEADS = [2, 1, 4]  # of 4 query heads: grouped, multi-query, one KV head per query head


def sampled_cases(architecture: str, count: int) -> list[tuple[str, dict]]:
    masks = ["causal", {"name": "sliding_window", "window": 3}]
    if architecture == "encoder":
        masks = ["none", "causal", {"name": "sliding_window", "window": 3}]
    cases = []
    for i in range(count):
        parts = {
            "attention": ATTENTION[i % 3], "positional": POSITIONAL[i % len(POSITIONAL)],
            "mask": masks[i % len(masks)], "block": BLOCKS[i % len(BLOCKS)],
            "feedforward": FEEDFORWARD[(i + 1) % len(FEEDFORWARD)], "norm": NORMS[(i // 3) % 2],
            "num_kv_heads": KV_HEADS[i % 3], "qk_norm": QK_NORMS[(i // 2) % 3],
        }
        mask = parts["mask"] if isinstance(parts["mask"], str) else parts["mask"]["name"]
        case_id = "-".join([architecture, parts["attention"], parts["positional"], mask,
                            parts["block"], parts["feedforward"], parts["norm"],
                            f"kv{parts['num_kv_heads']}", f"qk-{parts['qk_norm']}"])
        cases.append((case_id, tiny_config(architecture, **parts)))
    return cases


#: Rotary scalings (checkpoints' rope_scaling), each in a decoder whose tests pass their original
#: length of 8 positions.
SCALED_ROTARY = {
    "llama3": {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8},
    "yarn": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8},
    "longrope": {"type": "longrope", "original_max_position_embeddings": 8, "attention_factor": 1.2,
                 "short_factor": [1.0, 1.5], "long_factor": [2.0, 6.0]},
}
SCALED_CASES = [(f"decoder-sdpa-rotary_{name}-causal-pre_norm-swiglu-rmsnorm-kv2",
                 tiny_config("decoder", attention="sdpa", block="pre_norm", feedforward="swiglu",
                             norm="rmsnorm", positional={"name": "rotary", "scaling": scaling}))
                for name, scaling in SCALED_ROTARY.items()]

#: Layers that differ (``layer_types``): sliding-window layers with a rotary base of their own,
#: global ones, one without positions; soft-capped, rescaled scores; (1 + weight) norms.
LAYER_VARIANTS = {
    "layer_types": ["local", "global", "local", "nope"],
    "layer_variants": {
        "local": {"mask": {"name": "sliding_window", "window": 3},
                  "positional": {"name": "rotary", "base": 100.0}},
        "global": {},
        "nope": {"positional": "none", "attention": {"name": "sdpa", "scale": 0.2}},
    },
}
VARIANT_CASES = [
    ("decoder-sdpa_softcap-rotary-causal-sandwich-geglu-rmsnorm_unit_offset-kv2-layer_types",
     tiny_config("decoder", num_layers=4, attention={"name": "sdpa", "scale": 0.3, "softcap": 2.0},
                 positional="rotary", mask="causal", block="sandwich", feedforward="geglu",
                 norm={"name": "rmsnorm", "unit_offset": True},
                 qk_norm={"name": "per_head_rmsnorm", "unit_offset": True}, **LAYER_VARIANTS)),
    ("encoder-matmul_softcap-alibi-none-pre_norm-gelu-layernorm-kv1-layer_types",
     tiny_config("encoder", num_layers=3, num_kv_heads=1, attention={"name": "matmul", "softcap": 1.5},
                 positional="alibi", mask="none", block="pre_norm", feedforward="gelu", norm="layernorm",
                 layer_types=["windowed", "plain", "windowed"],
                 layer_variants={"windowed": {"mask": {"name": "sliding_window", "window": 2}},
                                 "plain": {}})),
]
#: The multipliers (Granite's, Gemma 2's logit cap) in each architecture with an output head:
#: embedding_scale, every block's residual_scale, an attention kernel's scale, logit_scale and
#: logit_softcap (tight enough to bite on tiny models' logits).
MULTIPLIER_CASES = [
    ("decoder-sdpa-rotary-causal-pre_norm-swiglu-rmsnorm-kv2-multipliers", tiny_config(
        "decoder", attention={"name": "sdpa", "scale": 0.3}, positional="rotary",
        block={"name": "pre_norm", "residual_scale": 0.22}, feedforward="swiglu", norm="rmsnorm",
        embedding_scale=12.0, logit_scale=0.125, logit_softcap=0.05, tie_embeddings=True)),
    ("decoder-matmul-alibi-sliding_window-post_sublayer_norm-gelu-layernorm-kv1-multipliers",
     tiny_config("decoder", attention="matmul", positional="alibi", num_kv_heads=1,
                 mask={"name": "sliding_window", "window": 3}, feedforward="gelu",
                 block={"name": "post_sublayer_norm", "residual_scale": 0.5}, logit_softcap=0.3)),
    ("encoder_decoder-einsum-sinusoidal-causal-post_norm-relu-layernorm-kv4-multipliers", tiny_config(
        "encoder_decoder", attention={"name": "einsum", "scale": 0.7}, num_kv_heads=4,
        block={"name": "post_norm", "residual_scale": 0.6}, embedding_scale=3.0, logit_scale=2.0,
        logit_softcap=1.5)),
    ("encoder-sdpa-learned-none-parallel-geglu-rmsnorm-kv2-multipliers", tiny_config(
        "encoder", attention="sdpa", positional="learned", mask="none", feedforward="geglu",
        norm="rmsnorm", block={"name": "parallel", "residual_scale": 1.7}, lm_head=True,
        embedding_scale=0.5, logit_scale=0.25, logit_softcap=0.2)),
    ("decoder-einsum-rotary-causal-sandwich-geglu-rmsnorm-kv1-multipliers", tiny_config(
        "decoder", attention={"name": "einsum", "softcap": 3.0}, positional="rotary", num_kv_heads=1,
        block={"name": "sandwich", "residual_scale": 0.4}, feedforward="geglu", norm="rmsnorm",
        embedding_scale=4.0, logit_softcap=0.5)),
]
#: Sentence outputs on encoders of other positions and blocks than the sentence-transformers
#: tests' BERT and RoBERTa (which export every pooling): the prompt left out of the pool (a
#: pooling_mask input) after rotary, two dense layers after ALiBi, and cross-encoder
#: classifiers with one label and token types, and with three labels (the logits alone).
SENTENCE_CASES = [
    ("encoder-sdpa-rotary-pre_norm-pooling_weightedmean-no_prompt", tiny_config(
        "encoder", attention="sdpa", positional="rotary", block="pre_norm", pooling="weightedmean",
        sentence_embedding={"include_prompt": False, "normalize": True})),
    ("encoder-matmul-alibi-parallel-pooling_lasttoken-dense", tiny_config(
        "encoder", attention="matmul", positional="alibi", block="parallel", pooling="lasttoken",
        sentence_embedding={"dense": [
            {"in_features": 16, "out_features": 12, "activation": "gelu", "bias": False},
            {"in_features": 12, "out_features": 6, "activation": "identity"}]})),
    ("encoder-sdpa-learned_token_types-classifier", tiny_config(
        "encoder", attention="sdpa", positional={"name": "learned", "token_types": 2},
        classifier={"num_labels": 1})),
    ("encoder-einsum-relative_bias-classifier_3_labels", tiny_config(
        "encoder", attention="einsum", positional="relative_bias",
        classifier={"num_labels": 3, "pooler_activation": "gelu"})),
]
#: The paper's translation setup: separate source and target vocabularies (no ``vocab_size``),
#: the target's smaller, with its own embedding table and an output head tied to it.
VOCABULARY_CASES = [
    ("encoder_decoder-sdpa-sinusoidal-causal-post_norm-relu-layernorm-kv2-separate_vocabularies",
     tiny_config("encoder_decoder", vocab_size=None, src_vocab_size=41, tgt_vocab_size=29,
                 attention="sdpa", tie_embeddings=True)),
]
CASES = (sampled_cases("decoder", 6) + sampled_cases("encoder_decoder", 6) + sampled_cases("encoder", 6)
         + SCALED_CASES + VARIANT_CASES + MULTIPLIER_CASES + SENTENCE_CASES + VOCABULARY_CASES)
