"""How each supported Hugging Face model type maps onto a transformer_kit config and weights.

Every quirk is a component parameter or a config key (``embedding_norm``, ``head_bias``,
``sinusoidal.layout``, ``learned.token_types``, ...), never a special case in the model code.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from transformer_kit.checkpoints.reader import CheckpointError, Weights

StateDict = dict[str, Tensor]


def _activation(name: str, model_type: str) -> dict[str, Any]:
    table = {
        "relu": {"name": "relu"},
        "gelu": {"name": "gelu"},
        "gelu_new": {"name": "gelu", "approximate": "tanh"},
        "gelu_pytorch_tanh": {"name": "gelu", "approximate": "tanh"},
        "gelu_fast": {"name": "gelu", "approximate": "tanh"},
        "silu": {"name": "silu"},
        "swish": {"name": "silu"},
    }
    if name not in table:
        raise CheckpointError(f"{model_type}: activation {name!r} is not supported; supported: "
                              f"{', '.join(table)}.")
    return dict(table[name])


def _require(condition: bool, model_type: str, what: str) -> None:
    if not condition:
        raise CheckpointError(f"{model_type} checkpoint with {what} is not supported.")


def _linear(out: StateDict, ours: str, weight: Tensor, bias: Tensor | None = None) -> None:
    out[f"{ours}.weight"] = weight
    if bias is not None:
        out[f"{ours}.bias"] = bias


def _copy(out: StateDict, ours: str, w: Weights, theirs: str, bias: bool = True) -> None:
    """Copy a layer's weight (and bias) whose layout already matches ours."""
    _linear(out, ours, w.get(f"{theirs}.weight"), w.get(f"{theirs}.bias") if bias else None)


def _attention(out: StateDict, ours: str, w: Weights, theirs: str, names: tuple[str, str, str, str],
               bias: bool) -> None:
    for our_name, their_name in zip(("q_proj", "k_proj", "v_proj", "o_proj"), names, strict=True):
        _copy(out, f"{ours}.{our_name}", w, f"{theirs}.{their_name}", bias)


# -- GPT-2 -----------------------------------------------------------------------------------
def gpt2_config(hf: dict) -> dict:
    _require(not hf.get("scale_attn_by_inverse_layer_idx"), "gpt2", "scale_attn_by_inverse_layer_idx")
    _require(not hf.get("reorder_and_upcast_attn"), "gpt2", "reorder_and_upcast_attn")
    _require(not hf.get("add_cross_attention"), "gpt2", "cross-attention")
    d_model = hf["n_embd"]
    return {
        "architecture": "decoder", "vocab_size": hf["vocab_size"], "d_model": d_model,
        "num_heads": hf["n_head"], "num_layers": hf["n_layer"],
        "d_ff": hf.get("n_inner") or 4 * d_model, "dropout": hf.get("resid_pdrop", 0.1),
        "max_len": hf["n_positions"], "pad_id": hf.get("pad_token_id"),
        "bos_id": hf.get("bos_token_id", 50256), "eos_id": hf.get("eos_token_id", 50256),
        "tie_embeddings": hf.get("tie_word_embeddings", True), "scale_embeddings": False,
        "attention_bias": True, "attention": "sdpa", "positional": "learned", "mask": "causal",
        "block": "pre_norm", "feedforward": _activation(hf.get("activation_function", "gelu_new"), "gpt2"),
        "norm": {"name": "layernorm", "eps": hf.get("layer_norm_epsilon", 1e-5)},
    }


def gpt2_weights(hf: dict, w: Weights, cfg) -> StateDict:
    out: StateDict = {"embed.token.weight": w.get("wte.weight"),
                      "embed.positional.table.weight": w.get("wpe.weight")}
    d = cfg.d_model
    for i in range(cfg.num_layers):
        ours, theirs = f"decoder.layers.{i}", f"h.{i}"
        _copy(out, f"{ours}.self_norm", w, f"{theirs}.ln_1")
        qkv_weight = w.get(f"{theirs}.attn.c_attn.weight").T  # Conv1D stores (in, out)
        qkv_bias = w.get(f"{theirs}.attn.c_attn.bias")
        for j, name in enumerate(("q_proj", "k_proj", "v_proj")):
            _linear(out, f"{ours}.self_attention.{name}", qkv_weight[j * d:(j + 1) * d],
                    qkv_bias[j * d:(j + 1) * d])
        _linear(out, f"{ours}.self_attention.o_proj", w.get(f"{theirs}.attn.c_proj.weight").T,
                w.get(f"{theirs}.attn.c_proj.bias"))
        _copy(out, f"{ours}.ff_norm", w, f"{theirs}.ln_2")
        _linear(out, f"{ours}.feedforward.linear1", w.get(f"{theirs}.mlp.c_fc.weight").T,
                w.get(f"{theirs}.mlp.c_fc.bias"))
        _linear(out, f"{ours}.feedforward.linear2", w.get(f"{theirs}.mlp.c_proj.weight").T,
                w.get(f"{theirs}.mlp.c_proj.bias"))
    _copy(out, "decoder.final_norm", w, "ln_f")
    out["head.weight"] = out["embed.token.weight"] if cfg.tie_embeddings else w.get("lm_head.weight")
    return out


# -- BERT ------------------------------------------------------------------------------------
def bert_config(hf: dict) -> dict:
    _require(hf.get("position_embedding_type", "absolute") == "absolute", "bert",
             f"position_embedding_type {hf.get('position_embedding_type')!r}")
    _require(not hf.get("is_decoder"), "bert", "is_decoder")
    vocab = hf["vocab_size"]
    return {
        "architecture": "encoder", "vocab_size": vocab, "d_model": hf["hidden_size"],
        "num_heads": hf["num_attention_heads"], "num_layers": hf["num_hidden_layers"],
        "d_ff": hf["intermediate_size"], "dropout": hf.get("hidden_dropout_prob", 0.1),
        "max_len": hf["max_position_embeddings"], "pad_id": hf.get("pad_token_id", 0),
        "bos_id": min(1, vocab - 1), "eos_id": min(2, vocab - 1),  # unused by an encoder
        "tie_embeddings": False, "scale_embeddings": False, "attention_bias": True,
        "embedding_norm": True, "attention": "sdpa",
        "positional": {"name": "learned", "token_types": hf.get("type_vocab_size", 2)},
        "mask": "none", "block": "post_norm",
        "feedforward": _activation(hf.get("hidden_act", "gelu"), "bert"),
        "norm": {"name": "layernorm", "eps": hf.get("layer_norm_eps", 1e-12)},
    }


def bert_weights(hf: dict, w: Weights, cfg) -> StateDict:
    out: StateDict = {
        "embed.token.weight": w.get("embeddings.word_embeddings.weight"),
        "embed.positional.table.weight": w.get("embeddings.position_embeddings.weight"),
        "embed.positional.token_type.weight": w.get("embeddings.token_type_embeddings.weight"),
    }
    _copy(out, "embed.norm", w, "embeddings.LayerNorm")
    for i in range(cfg.num_layers):
        ours, theirs = f"encoder.layers.{i}", f"encoder.layer.{i}"
        _attention(out, f"{ours}.self_attention", w, f"{theirs}.attention",
                   ("self.query", "self.key", "self.value", "output.dense"), True)
        _copy(out, f"{ours}.self_norm", w, f"{theirs}.attention.output.LayerNorm")
        _copy(out, f"{ours}.feedforward.linear1", w, f"{theirs}.intermediate.dense")
        _copy(out, f"{ours}.feedforward.linear2", w, f"{theirs}.output.dense")
        _copy(out, f"{ours}.ff_norm", w, f"{theirs}.output.LayerNorm")
    return out


# -- Llama -----------------------------------------------------------------------------------
def _rope_theta(hf: dict) -> float:
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    _require(kind == "default", "llama", f"rope_type {kind!r} (only 'default' rotary is)")
    return float(rope.get("rope_theta", hf.get("rope_theta", 10000.0)))


def _first(ids: Any) -> Any:
    return ids[0] if isinstance(ids, list) else ids


def llama_config(hf: dict) -> dict:
    d_model, heads = hf["hidden_size"], hf["num_attention_heads"]
    head_dim = hf.get("head_dim") or d_model // heads
    _require(head_dim * heads == d_model, "llama", f"head_dim {head_dim} != hidden_size / heads")
    _require(hf.get("hidden_act", "silu") == "silu", "llama", f"hidden_act {hf.get('hidden_act')!r}")
    return {
        "architecture": "decoder", "vocab_size": hf["vocab_size"], "d_model": d_model,
        "num_heads": heads, "num_kv_heads": hf.get("num_key_value_heads") or heads,
        "num_layers": hf["num_hidden_layers"], "d_ff": hf["intermediate_size"],
        "dropout": hf.get("attention_dropout", 0.0), "max_len": hf["max_position_embeddings"],
        "pad_id": _first(hf.get("pad_token_id")), "bos_id": _first(hf.get("bos_token_id", 1)),
        "eos_id": _first(hf.get("eos_token_id", 2)),
        "tie_embeddings": hf.get("tie_word_embeddings", False), "scale_embeddings": False,
        "attention_bias": hf.get("attention_bias", False), "attention": "sdpa",
        "positional": {"name": "rotary", "base": _rope_theta(hf)}, "mask": "causal",
        "block": "pre_norm", "feedforward": {"name": "swiglu", "bias": hf.get("mlp_bias", False)},
        "norm": {"name": "rmsnorm", "eps": hf.get("rms_norm_eps", 1e-6)},
    }


def llama_weights(hf: dict, w: Weights, cfg) -> StateDict:
    out: StateDict = {"embed.token.weight": w.get("embed_tokens.weight")}
    for i in range(cfg.num_layers):
        ours, theirs = f"decoder.layers.{i}", f"layers.{i}"
        _attention(out, f"{ours}.self_attention", w, f"{theirs}.self_attn",
                   ("q_proj", "k_proj", "v_proj", "o_proj"), cfg.attention_bias)
        out[f"{ours}.self_norm.weight"] = w.get(f"{theirs}.input_layernorm.weight")
        out[f"{ours}.ff_norm.weight"] = w.get(f"{theirs}.post_attention_layernorm.weight")
        mlp_bias = cfg.feedforward.params.get("bias", False)
        for name in ("gate", "up", "down"):
            _copy(out, f"{ours}.feedforward.{name}", w, f"{theirs}.mlp.{name}_proj", mlp_bias)
    out["decoder.final_norm.weight"] = w.get("norm.weight")
    out["head.weight"] = out["embed.token.weight"] if cfg.tie_embeddings else w.get("lm_head.weight")
    return out


# -- Marian ----------------------------------------------------------------------------------
def marian_config(hf: dict) -> dict:
    for a, b in (("encoder_attention_heads", "decoder_attention_heads"),
                 ("encoder_ffn_dim", "decoder_ffn_dim")):
        _require(hf.get(a) == hf.get(b), "marian", f"{a} != {b}")
    _require(not hf.get("normalize_before"), "marian", "normalize_before")
    vocab = hf["vocab_size"]
    decoder_vocab = hf.get("decoder_vocab_size") or vocab
    shared = hf.get("share_encoder_decoder_embeddings", True) and decoder_vocab == vocab
    sizes = {"vocab_size": vocab} if shared else {"src_vocab_size": vocab,
                                                  "tgt_vocab_size": decoder_vocab}
    return {
        "architecture": "encoder_decoder", **sizes, "d_model": hf["d_model"],
        "num_heads": hf["encoder_attention_heads"], "encoder_layers": hf["encoder_layers"],
        "decoder_layers": hf["decoder_layers"], "d_ff": hf["encoder_ffn_dim"],
        "dropout": hf.get("dropout", 0.1), "max_len": hf.get("max_position_embeddings", 512),
        "pad_id": hf["pad_token_id"], "bos_id": hf.get("decoder_start_token_id", hf["pad_token_id"]),
        "eos_id": hf["eos_token_id"], "tie_embeddings": hf.get("tie_word_embeddings", True),
        "scale_embeddings": bool(hf.get("scale_embedding", False)), "attention_bias": True,
        "head_bias": True, "attention": "sdpa",
        "positional": {"name": "sinusoidal", "layout": "split"}, "mask": "causal",
        "block": "post_norm", "feedforward": _activation(hf.get("activation_function", "gelu"), "marian"),
        "norm": {"name": "layernorm", "eps": 1e-5},
    }


def marian_weights(hf: dict, w: Weights, cfg) -> StateDict:
    shared = w.get("shared.weight", "encoder.embed_tokens.weight")
    out: StateDict = {"src_embed.token.weight": shared if cfg.shared_vocab else
                      w.get("encoder.embed_tokens.weight")}
    out["tgt_embed.token.weight"] = shared if cfg.shared_vocab else w.get("decoder.embed_tokens.weight")
    names = ("q_proj", "k_proj", "v_proj", "out_proj")
    for side, count in (("encoder", cfg.n_encoder_layers), ("decoder", cfg.n_decoder_layers)):
        for i in range(count):
            ours, theirs = f"{side}.layers.{i}", f"{side}.layers.{i}"
            _attention(out, f"{ours}.self_attention", w, f"{theirs}.self_attn", names, True)
            _copy(out, f"{ours}.self_norm", w, f"{theirs}.self_attn_layer_norm")
            if side == "decoder":
                _attention(out, f"{ours}.cross_attention", w, f"{theirs}.encoder_attn", names, True)
                _copy(out, f"{ours}.cross_norm", w, f"{theirs}.encoder_attn_layer_norm")
            _copy(out, f"{ours}.feedforward.linear1", w, f"{theirs}.fc1")
            _copy(out, f"{ours}.feedforward.linear2", w, f"{theirs}.fc2")
            _copy(out, f"{ours}.ff_norm", w, f"{theirs}.final_layer_norm")
    out["head.weight"] = out["tgt_embed.token.weight"] if cfg.tie_embeddings else w.get("lm_head.weight")
    out["head.bias"] = w.get("final_logits_bias").reshape(-1)
    return out


@dataclass(frozen=True)
class Family:
    """One supported ``model_type``: its config mapping and its weight mapping."""

    model_type: str
    to_config: Callable[[dict], dict]
    to_state_dict: Callable[[dict, Weights, Any], StateDict]
    prefixes: tuple[str, ...]  # where the base model's tensors may sit
    probe: str  # a tensor every checkpoint of the family has


FAMILIES: dict[str, Family] = {
    "gpt2": Family("gpt2", gpt2_config, gpt2_weights, ("transformer.", ""), "wte.weight"),
    "bert": Family("bert", bert_config, bert_weights, ("", "bert."), "embeddings.word_embeddings.weight"),
    "llama": Family("llama", llama_config, llama_weights, ("model.", ""), "embed_tokens.weight"),
    "marian": Family("marian", marian_config, marian_weights, ("model.", ""),
                     "encoder.layers.0.fc1.weight"),
}
