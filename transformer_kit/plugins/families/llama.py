"""Llama (``LlamaForCausalLM``): decoder, RMSNorm, rotary (``base`` = rope_theta; Llama 3.1's
``llama3`` scaling, ``linear`` and ``yarn``), SwiGLU, grouped KV heads, no biases, untied head."""

from __future__ import annotations

from collections.abc import Callable

from transformer_kit import CheckpointFamily, ModelConfig
from transformer_kit.checkpoints import StateDict, Weights, copy_attention, copy_linear, first_id, require

#: config.json's rotary scaling keys the ``rotary`` component's ``scaling`` takes, by type.
_SCALING_KEYS = {
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow",
             "attention_factor", "mscale", "mscale_all_dim", "truncate"),
    "longrope": ("short_factor", "long_factor", "original_max_position_embeddings",
                 "attention_factor", "factor"),
}


def rotary_spec(hf: dict, family: str, rotary_dim: int | None = None) -> dict:
    """The ``rotary`` component of config.json's ``rope_theta`` and ``rope_scaling`` (or
    transformers 5's ``rope_parameters``); a scaling the kit does not compute is refused
    naming the field."""
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    field = "rope_parameters" if hf.get("rope_parameters") else "rope_scaling"
    require(kind == "default" or kind in _SCALING_KEYS, family,
            f"{field} of type {kind!r} (the kit computes default, {', '.join(_SCALING_KEYS)})")
    spec: dict = {"name": "rotary", "base": float(rope.get("rope_theta", hf.get("rope_theta", 10000.0)))}
    if rotary_dim is not None:
        spec["rotary_dim"] = rotary_dim
    if kind != "default":
        scaling = {key: rope[key] for key in _SCALING_KEYS[kind] if rope.get(key) is not None}
        if kind in ("yarn", "longrope"):  # transformers falls back on max_position_embeddings
            scaling.setdefault("original_max_position_embeddings",
                               hf.get("original_max_position_embeddings") or hf["max_position_embeddings"])
            scaling.setdefault("factor", hf["max_position_embeddings"]
                               / scaling["original_max_position_embeddings"])
        spec["scaling"] = {"type": kind, **scaling}
    return spec


def llama_config(hf: dict, family: str = "llama") -> dict:
    """The config of a Llama-layout checkpoint (also Mistral's and Qwen2's); ``family`` names
    it in refusals."""
    d_model, heads = hf["hidden_size"], hf["num_attention_heads"]
    head_dim = hf.get("head_dim") or d_model // heads
    require(hf.get("hidden_act", "silu") == "silu", family, f"hidden_act {hf.get('hidden_act')!r}")
    # heads of another width than d_model / heads (Mistral Nemo) name it; the others need not
    return {
        **({} if head_dim * heads == d_model else {"head_dim": head_dim}),
        "architecture": "decoder", "vocab_size": hf["vocab_size"], "d_model": d_model,
        "num_heads": heads, "num_kv_heads": hf.get("num_key_value_heads") or heads,
        "num_layers": hf["num_hidden_layers"], "d_ff": hf["intermediate_size"],
        "dropout": hf.get("attention_dropout", 0.0), "max_len": hf["max_position_embeddings"],
        "pad_id": first_id(hf.get("pad_token_id")), "bos_id": first_id(hf.get("bos_token_id", 1)),
        "eos_id": first_id(hf.get("eos_token_id", 2)),
        "tie_embeddings": hf.get("tie_word_embeddings", False), "scale_embeddings": False,
        "attention_bias": hf.get("attention_bias", False), "attention": "sdpa",
        "positional": rotary_spec(hf, family), "mask": "causal",
        "block": "pre_norm", "feedforward": {"name": "swiglu", "bias": hf.get("mlp_bias", False)},
        "norm": {"name": "rmsnorm", "eps": hf.get("rms_norm_eps", 1e-6)},
    }


#: Copies layer ``i``'s feed-forward: (out, w, cfg, ours, theirs, i), ``ours`` and ``theirs``
#: the layer's prefixes (``decoder.layers.{i}``, ``layers.{i}``).
FeedForwardCopier = Callable[[StateDict, Weights, ModelConfig, str, str, int], None]


def copy_mlp(out: StateDict, w: Weights, cfg: ModelConfig, ours: str, theirs: str, i: int) -> None:
    """The dense SwiGLU: ``mlp.gate_proj``, ``up_proj``, ``down_proj`` -> ``feedforward.gate``,
    ``up``, ``down`` (biases when the layer's feed-forward has them)."""
    spec = cfg.layer_component("feedforward", i) or cfg.feedforward  # the layer variant's, if any
    bias = spec.params.get("bias", False)
    for name in ("gate", "up", "down"):
        copy_linear(out, f"{ours}.feedforward.{name}", w, f"{theirs}.mlp.{name}_proj", bias)


def llama_weights(hf: dict, w: Weights, cfg: ModelConfig,
                  norms: tuple[str, str] = ("input_layernorm", "post_attention_layernorm"),
                  feedforward: FeedForwardCopier = copy_mlp) -> StateDict:
    """The weights of a Llama-layout checkpoint (also Mistral's, Qwen2's, Qwen3's, OLMo2's):
    ``norms`` names each layer's attention and feed-forward norms; ``self_attn.q_norm`` and
    ``k_norm`` are read when the config has a ``qk_norm``; ``feedforward`` copies each layer's
    feed-forward (the dense SwiGLU by default; a mixture of experts' families give theirs)."""
    out: StateDict = {"embed.token.weight": w.get("embed_tokens.weight")}
    for i in range(cfg.num_layers):
        ours, theirs = f"decoder.layers.{i}", f"layers.{i}"
        copy_attention(out, f"{ours}.self_attention", w, f"{theirs}.self_attn",
                       ("q_proj", "k_proj", "v_proj", "o_proj"), cfg.attention_bias,
                       cfg.attention_out_bias)
        out[f"{ours}.self_norm.weight"] = w.get(f"{theirs}.{norms[0]}.weight")
        out[f"{ours}.ff_norm.weight"] = w.get(f"{theirs}.{norms[1]}.weight")
        for name in ("q_norm", "k_norm") if cfg.qk_norm is not None else ():
            out[f"{ours}.self_attention.qk_norm.{name}.weight"] = w.get(f"{theirs}.self_attn.{name}.weight")
        feedforward(out, w, cfg, ours, theirs, i)
    out["decoder.final_norm.weight"] = w.get("norm.weight")
    out["head.weight"] = out["embed.token.weight"] if cfg.tie_embeddings else w.get("lm_head.weight")
    return out


FAMILY = CheckpointFamily("llama", llama_config, llama_weights, probe="embed_tokens.weight",
                          prefixes=("model.", ""), description="LlamaForCausalLM")
