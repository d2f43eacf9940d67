"""GPT-2 (``GPT2LMHeadModel``): decoder, pre_norm, learned positions, tanh GELU, fused QKV in
Conv1D layout (in, out), tied head, final norm."""

from __future__ import annotations

from transformer_kit import CheckpointFamily, ModelConfig
from transformer_kit.checkpoints import StateDict, Weights, copy_linear, put_linear, require
from transformer_kit.plugins.feedforward import feedforward_for_activation


def gpt2_config(hf: dict) -> dict:
    require(not hf.get("scale_attn_by_inverse_layer_idx"), "gpt2", "scale_attn_by_inverse_layer_idx")
    require(not hf.get("reorder_and_upcast_attn"), "gpt2", "reorder_and_upcast_attn")
    require(not hf.get("add_cross_attention"), "gpt2", "cross-attention")
    d_model = hf["n_embd"]
    return {
        "architecture": "decoder", "vocab_size": hf["vocab_size"], "d_model": d_model,
        "num_heads": hf["n_head"], "num_layers": hf["n_layer"],
        "d_ff": hf.get("n_inner") or 4 * d_model, "dropout": hf.get("resid_pdrop", 0.1),
        "max_len": hf["n_positions"], "pad_id": hf.get("pad_token_id"),
        "bos_id": hf.get("bos_token_id", 50256), "eos_id": hf.get("eos_token_id", 50256),
        "tie_embeddings": hf.get("tie_word_embeddings", True), "scale_embeddings": False,
        "attention_bias": True, "attention": "sdpa", "positional": "learned", "mask": "causal",
        "block": "pre_norm",
        "feedforward": feedforward_for_activation(hf.get("activation_function", "gelu_new"), "gpt2"),
        "norm": {"name": "layernorm", "eps": hf.get("layer_norm_epsilon", 1e-5)},
    }


def gpt2_weights(hf: dict, w: Weights, cfg: ModelConfig) -> StateDict:
    out: StateDict = {"embed.token.weight": w.get("wte.weight"),
                      "embed.positional.table.weight": w.get("wpe.weight")}
    d = cfg.d_model
    for i in range(cfg.num_layers):
        ours, theirs = f"decoder.layers.{i}", f"h.{i}"
        copy_linear(out, f"{ours}.self_norm", w, f"{theirs}.ln_1")
        qkv_weight = w.get(f"{theirs}.attn.c_attn.weight").T  # Conv1D stores (in, out)
        qkv_bias = w.get(f"{theirs}.attn.c_attn.bias")
        for j, name in enumerate(("q_proj", "k_proj", "v_proj")):
            put_linear(out, f"{ours}.self_attention.{name}", qkv_weight[j * d:(j + 1) * d],
                       qkv_bias[j * d:(j + 1) * d])
        put_linear(out, f"{ours}.self_attention.o_proj", w.get(f"{theirs}.attn.c_proj.weight").T,
                   w.get(f"{theirs}.attn.c_proj.bias"))
        copy_linear(out, f"{ours}.ff_norm", w, f"{theirs}.ln_2")
        put_linear(out, f"{ours}.feedforward.linear1", w.get(f"{theirs}.mlp.c_fc.weight").T,
                   w.get(f"{theirs}.mlp.c_fc.bias"))
        put_linear(out, f"{ours}.feedforward.linear2", w.get(f"{theirs}.mlp.c_proj.weight").T,
                   w.get(f"{theirs}.mlp.c_proj.bias"))
    copy_linear(out, "decoder.final_norm", w, "ln_f")
    out["head.weight"] = out["embed.token.weight"] if cfg.tie_embeddings else w.get("lm_head.weight")
    return out


FAMILY = CheckpointFamily("gpt2", gpt2_config, gpt2_weights, probe="wte.weight",
                          prefixes=("transformer.", ""), description="GPT2LMHeadModel")
