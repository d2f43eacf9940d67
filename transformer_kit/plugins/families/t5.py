"""T5 (``T5ForConditionalGeneration``; T5 v1.1 and Flan-T5 alike): encoder-decoder, the
``relative_bias`` positional (bucketed key - query distances, bidirectional in the encoder and
causal in the decoder, one table per stack shared by its layers), no score scaling
(``attention: {name: sdpa, scale: 1.0}``), pre-norm RMSNorm without mean subtraction, ReLU or
gated-GELU (``geglu``) feed-forwards, no biases, generation from ``decoder_start_token_id``.

T5 v1.0's head reads the decoder's output times d_model ** -0.5: that factor is folded into the
head's weights, so the kit's head is untied (its encoder and decoder embeddings are two equal
tables)."""

from __future__ import annotations

from transformer_kit import CheckpointFamily, ModelConfig
from transformer_kit.checkpoints import StateDict, Weights, copy_linear, require

#: T5's ``feed_forward_proj`` -> the feedforward component.
_FEEDFORWARD = {
    "relu": {"name": "relu", "bias": False},
    "gated-gelu": {"name": "geglu", "approximate": "tanh"},  # gelu_new, T5 v1.1 and Flan-T5
    "gated-silu": {"name": "swiglu"},
}


def t5_config(hf: dict) -> dict:
    d_model, heads = hf["d_model"], hf["num_heads"]
    head_dim = hf.get("d_kv", d_model // heads)  # Flan-T5-small, T5 v1.1: heads x d_kv != d_model
    projection = hf.get("feed_forward_proj", "relu")
    require(projection in _FEEDFORWARD, "t5",
            f"feed_forward_proj {projection!r} (supported: {', '.join(_FEEDFORWARD)})")
    require(hf.get("is_encoder_decoder", True), "t5", "is_encoder_decoder false (T5EncoderModel)")
    start = hf.get("decoder_start_token_id", hf.get("pad_token_id", 0))
    return {
        "architecture": "encoder_decoder", "vocab_size": hf["vocab_size"], "d_model": d_model,
        "num_heads": heads, **({} if head_dim * heads == d_model else {"head_dim": head_dim}),
        "encoder_layers": hf["num_layers"],
        "decoder_layers": hf.get("num_decoder_layers") or hf["num_layers"], "d_ff": hf["d_ff"],
        "dropout": hf.get("dropout_rate", 0.1), "max_len": hf.get("n_positions", 512),
        "pad_id": hf.get("pad_token_id", 0), "bos_id": start, "eos_id": hf.get("eos_token_id", 1),
        "tie_embeddings": False, "scale_embeddings": False, "attention_bias": False,
        "attention": {"name": "sdpa", "scale": 1.0},
        "positional": {"name": "relative_bias",
                       "num_buckets": hf.get("relative_attention_num_buckets", 32),
                       "max_distance": hf.get("relative_attention_max_distance", 128)},
        "mask": "causal", "block": "pre_norm", "feedforward": dict(_FEEDFORWARD[projection]),
        "norm": {"name": "rmsnorm", "eps": hf.get("layer_norm_epsilon", 1e-6)},
    }


def t5_weights(hf: dict, w: Weights, cfg: ModelConfig) -> StateDict:
    shared = w.get("shared.weight", "encoder.embed_tokens.weight")
    out: StateDict = {"src_embed.token.weight": shared, "tgt_embed.token.weight": shared,
                      "src_embed.positional.table.weight":
                          w.get("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"),
                      "tgt_embed.positional.table.weight":
                          w.get("decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight")}
    gated = cfg.feedforward.name != "relu"
    for side, count in (("encoder", cfg.n_encoder_layers), ("decoder", cfg.n_decoder_layers)):
        for i in range(count):
            ours, theirs = f"{side}.layers.{i}", f"{side}.block.{i}.layer"
            _attention(out, f"{ours}.self_attention", w, f"{theirs}.0.SelfAttention")
            out[f"{ours}.self_norm.weight"] = w.get(f"{theirs}.0.layer_norm.weight")
            ff = 1
            if side == "decoder":
                _attention(out, f"{ours}.cross_attention", w, f"{theirs}.1.EncDecAttention")
                out[f"{ours}.cross_norm.weight"] = w.get(f"{theirs}.1.layer_norm.weight")
                ff = 2
            dense = f"{theirs}.{ff}.DenseReluDense"
            if gated:
                copy_linear(out, f"{ours}.feedforward.gate", w, f"{dense}.wi_0", False)
                copy_linear(out, f"{ours}.feedforward.up", w, f"{dense}.wi_1", False)
                copy_linear(out, f"{ours}.feedforward.down", w, f"{dense}.wo", False)
            else:
                copy_linear(out, f"{ours}.feedforward.linear1", w, f"{dense}.wi", False)
                copy_linear(out, f"{ours}.feedforward.linear2", w, f"{dense}.wo", False)
            out[f"{ours}.ff_norm.weight"] = w.get(f"{theirs}.{ff}.layer_norm.weight")
        out[f"{side}.final_norm.weight"] = w.get(f"{side}.final_layer_norm.weight")
    head = w.get("lm_head.weight", "shared.weight")  # a tied head is often not saved
    out["head.weight"] = head * cfg.d_model ** -0.5 if _scales_decoder_outputs(hf) else head
    return out


def _scales_decoder_outputs(hf: dict) -> bool:
    """Whether the decoder's output is multiplied by d_model ** -0.5 before the head: T5 v1.0
    does, v1.1 and Flan-T5 do not. Configs say so by ``scale_decoder_outputs`` (transformers 5)
    or, before it, by ``tie_word_embeddings`` (true: scaled)."""
    return bool(hf.get("scale_decoder_outputs", hf.get("tie_word_embeddings", True)))


def _attention(out: StateDict, ours: str, w: Weights, theirs: str) -> None:
    for our_name, their_name in (("q_proj", "q"), ("k_proj", "k"), ("v_proj", "v"), ("o_proj", "o")):
        copy_linear(out, f"{ours}.{our_name}", w, f"{theirs}.{their_name}", False)


FAMILY = CheckpointFamily("t5", t5_config, t5_weights, probe="encoder.final_layer_norm.weight",
                          prefixes=("",), description="T5ForConditionalGeneration (T5, T5 v1.1, Flan-T5)")
