"""GPT-NeoX (``GPTNeoXForCausalLM``, Pythia): decoder, the ``parallel`` block (attention and
feed-forward both read the layer's input; ``pre_norm`` where ``use_parallel_residual`` is
false), partial rotary (``rotary_dim`` = head_dim x rotary_pct), the fused QKV projection split
per head, GELU, LayerNorm, untied head."""

from __future__ import annotations

from transformer_kit import CheckpointFamily, ModelConfig
from transformer_kit.checkpoints import StateDict, Weights, copy_linear, put_linear, require
from transformer_kit.plugins.feedforward import feedforward_for_activation


def _rotary(hf: dict, head_dim: int) -> dict:
    """The rotary encoding of config.json as released (rotary_pct, rotary_emb_base) or as
    newer transformers write it (rope_parameters)."""
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    require(kind == "default", "gpt_neox", f"rope_type {kind!r} (only 'default' rotary is)")
    fraction = rope.get("partial_rotary_factor", hf.get("rotary_pct", hf.get("partial_rotary_factor", 0.25)))
    base = rope.get("rope_theta", hf.get("rotary_emb_base", hf.get("rope_theta", 10000.0)))
    rotary_dim = int(head_dim * fraction)
    require(rotary_dim % 2 == 0 and rotary_dim > 0, "gpt_neox",
            f"rotary_pct {fraction} (head_dim x rotary_pct = {rotary_dim}, not a positive even number)")
    return {"name": "rotary", "base": float(base), "rotary_dim": rotary_dim}


def gpt_neox_config(hf: dict) -> dict:
    d_model, heads = hf["hidden_size"], hf["num_attention_heads"]
    require(d_model % heads == 0, "gpt_neox", f"hidden_size {d_model} not divisible by {heads} heads")
    return {
        "architecture": "decoder", "vocab_size": hf["vocab_size"], "d_model": d_model,
        "num_heads": heads, "num_layers": hf["num_hidden_layers"], "d_ff": hf["intermediate_size"],
        "dropout": hf.get("hidden_dropout", 0.0), "max_len": hf["max_position_embeddings"],
        "pad_id": hf.get("pad_token_id"), "bos_id": hf.get("bos_token_id", 0),
        "eos_id": hf.get("eos_token_id", 2), "tie_embeddings": hf.get("tie_word_embeddings", False),
        "scale_embeddings": False, "attention_bias": hf.get("attention_bias", True),
        "attention": "sdpa", "positional": _rotary(hf, d_model // heads), "mask": "causal",
        "block": "parallel" if hf.get("use_parallel_residual", True) else "pre_norm",
        "feedforward": feedforward_for_activation(hf.get("hidden_act", "gelu"), "gpt_neox"),
        "norm": {"name": "layernorm", "eps": hf.get("layer_norm_eps", 1e-5)},
    }


def gpt_neox_weights(hf: dict, w: Weights, cfg: ModelConfig) -> StateDict:
    out: StateDict = {"embed.token.weight": w.get("embed_in.weight")}
    d, heads, bias = cfg.d_model, cfg.num_heads, cfg.attention_bias
    for i in range(cfg.num_layers):
        ours, theirs = f"decoder.layers.{i}", f"layers.{i}"
        copy_linear(out, f"{ours}.self_norm", w, f"{theirs}.input_layernorm")
        copy_linear(out, f"{ours}.ff_norm", w, f"{theirs}.post_attention_layernorm")
        # (3 d, d) laid out per head as [q_h; k_h; v_h]: split into q, k and v (d, d) each
        weight = w.get(f"{theirs}.attention.query_key_value.weight").reshape(heads, 3, d // heads, d)
        fused_bias = (w.get(f"{theirs}.attention.query_key_value.bias").reshape(heads, 3, d // heads)
                      if bias else None)
        for j, name in enumerate(("q_proj", "k_proj", "v_proj")):
            put_linear(out, f"{ours}.self_attention.{name}", weight[:, j].reshape(d, d),
                       fused_bias[:, j].reshape(d) if bias else None)
        copy_linear(out, f"{ours}.self_attention.o_proj", w, f"{theirs}.attention.dense", bias)
        copy_linear(out, f"{ours}.feedforward.linear1", w, f"{theirs}.mlp.dense_h_to_4h")
        copy_linear(out, f"{ours}.feedforward.linear2", w, f"{theirs}.mlp.dense_4h_to_h")
    copy_linear(out, "decoder.final_norm", w, "final_layer_norm")
    out["head.weight"] = out["embed.token.weight"] if cfg.tie_embeddings else w.get("embed_out.weight")
    return out


FAMILY = CheckpointFamily("gpt_neox", gpt_neox_config, gpt_neox_weights, probe="embed_in.weight",
                          prefixes=("gpt_neox.", ""), description="GPTNeoXForCausalLM")
