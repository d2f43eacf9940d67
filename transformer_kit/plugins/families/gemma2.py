"""Gemma 2 (``Gemma2ForCausalLM``): Gemma's layout (RMSNorm by (1 + weight), scaled embeddings,
GeGLU, tied head) with a norm before and after each sub-layer (``block: sandwich``), attention
scores scaled by ``query_pre_attn_scalar`` ** -0.5 and soft-capped (``attn_logit_softcapping``),
sliding-window layers alternating with global ones (``layer_types``, ``sliding_window``) and
soft-capped logits (``final_logit_softcapping``)."""

from __future__ import annotations

from transformer_kit import CheckpointFamily, ModelConfig
from transformer_kit.checkpoints import StateDict, Weights, require
from transformer_kit.plugins.families._layers import FULL, SLIDING, hf_layer_types, variation
from transformer_kit.plugins.families.gemma import gemma_config
from transformer_kit.plugins.families.llama import llama_weights


def attention_spec(hf: dict) -> dict:
    """The sdpa kernel with Gemma's score scale and, when configured, its score soft-cap."""
    spec: dict = {"name": "sdpa", "scale": float(hf.get("query_pre_attn_scalar", 256)) ** -0.5}
    if hf.get("attn_logit_softcapping") is not None:
        spec["softcap"] = float(hf["attn_logit_softcapping"])
    return spec


def sliding_variants(hf: dict, family: str, default_every: int, sliding: dict | None = None) -> dict:
    """``layer_types``/``layer_variants`` of sliding-window and global layers; ``sliding``: more
    components the sliding layers replace (Gemma 3's rotary base)."""
    types = hf_layer_types(hf, family, default_every)
    window = hf.get("sliding_window")
    require(SLIDING not in types or (isinstance(window, int) and window > 0), family,
            f"sliding layers and sliding_window {window!r} (a positive number of tokens is needed)")
    local = {"mask": {"name": "sliding_window", "window": window}, **(sliding or {})}
    return variation(types, {SLIDING: local, FULL: {}})


def gemma2_config(hf: dict, family: str = "gemma2") -> dict:
    config = gemma_config(hf, family)
    config.update(block="sandwich", attention=attention_spec(hf),
                  **sliding_variants(hf, family, default_every=2))
    if hf.get("final_logit_softcapping") is not None:
        config["logit_softcap"] = float(hf["final_logit_softcapping"])
    return config


def gemma2_weights(hf: dict, w: Weights, cfg: ModelConfig) -> StateDict:
    """Llama's weights, with the norms after attention and around the feed-forward."""
    out = llama_weights(hf, w, cfg, norms=("input_layernorm", "pre_feedforward_layernorm"))
    for i in range(cfg.num_layers):
        ours, theirs = f"decoder.layers.{i}", f"layers.{i}"
        out[f"{ours}.self_post_norm.weight"] = w.get(f"{theirs}.post_attention_layernorm.weight")
        out[f"{ours}.ff_post_norm.weight"] = w.get(f"{theirs}.post_feedforward_layernorm.weight")
    return out


FAMILY = CheckpointFamily("gemma2", gemma2_config, gemma2_weights, probe="embed_tokens.weight",
                          prefixes=("model.", ""), description="Gemma2ForCausalLM")
