"""gpt-oss (``GptOssForCausalLM``): Llama's layout with biases on q, k, v and o, a learned
attention sink per head (the kernel's ``sinks``), sliding-window layers alternating with full
ones (``layer_types``, ``sliding_window``), YaRN rotary positions (``truncate: false``), and a
mixture of experts in every layer: the top-k of the router's logits (with a bias), a softmax
over those k, and experts that are SwiGLUs with biases in gpt-oss's clamped form
(``swiglu_alpha``, ``swiglu_limit``, the up projection + 1).

The experts are read from the fused tensors transformers writes (``experts.gate_up_proj``
(experts, d_model, 2 x d_ff), gate and up columns interleaved; ``down_proj`` (experts, d_ff,
d_model); their biases) or from the Hub's MXFP4 form (``gate_up_proj_blocks`` and
``_scales``, ``down_proj_blocks`` and ``_scales``: (experts, out, in) in 4-bit blocks),
dequantized to float32 one expert at a time (:mod:`transformer_kit.checkpoints.mxfp4`), or
one tensor per expert and projection (``experts.{e}.gate_proj.weight`` (d_ff, d_model) and
``.bias``, ``up_proj``, ``down_proj``), as ``from_gguf`` names the experts of a llama.cpp
file, which are taken unchanged (so a quantized file's blocks stay known).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from transformer_kit import CheckpointFamily, ModelConfig
from transformer_kit.checkpoints import StateDict, Weights, copy_linear, require
from transformer_kit.checkpoints.deferred import SharedRead
from transformer_kit.checkpoints.mxfp4 import BLOCK, check_mxfp4, dequantize_mxfp4
from transformer_kit.plugins.families._experts import expert_count
from transformer_kit.plugins.families.gemma2 import sliding_variants
from transformer_kit.plugins.families.llama import llama_config, llama_weights

FAMILY_NAME = "gpt_oss"


def _number(hf: dict, key: str, default: float | None) -> float | None:
    """config.json's ``key`` as a float (``default`` when absent); refused unless finite."""
    value = hf.get(key, default)
    require(value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)
                              and math.isfinite(value)), FAMILY_NAME, f"{key} {value!r} (a finite number)")
    return None if value is None else float(value)


def expert_spec(hf: dict) -> dict:
    """Each expert: a SwiGLU with biases in gpt-oss's clamped form."""
    limit = _number(hf, "swiglu_limit", 7.0)
    require(limit is None or limit > 0, FAMILY_NAME, f"swiglu_limit {limit!r} (a positive clamp bound)")
    return {"name": "swiglu", "bias": True, "alpha": _number(hf, "swiglu_alpha", 1.702),
            "limit": limit, "up_offset": 1.0}


def gpt_oss_config(hf: dict) -> dict:
    """The config of a gpt-oss checkpoint (transformers' defaults where config.json is silent:
    4 experts per token, swiglu_alpha 1.702, swiglu_limit 7, rms_norm_eps 1e-5)."""
    quantization = hf.get("quantization_config") or {}
    method = quantization.get("quant_method")
    require(method in (None, "mxfp4"), FAMILY_NAME,
            f"quantization_config.quant_method {method!r} (the kit reads float and mxfp4 checkpoints)")
    # transformers' gpt-oss never reads hidden_act: its experts are always the clamped SwiGLU
    config = llama_config({**hf, "mlp_bias": False, "attention_bias": hf.get("attention_bias", True),
                           "hidden_act": "silu"}, FAMILY_NAME)
    config["norm"] = {"name": "rmsnorm", "eps": hf.get("rms_norm_eps", 1e-5)}
    config["attention"] = {"name": "sdpa", "sinks": True}
    config["feedforward"] = {"name": "moe", "num_experts": expert_count(hf, FAMILY_NAME),
                             "top_k": hf.get("num_experts_per_tok", 4), "router": "softmax_topk",
                             "router_bias": True, "expert": expert_spec(hf)}
    config.update(sliding_variants(hf, FAMILY_NAME, default_every=2))
    return config


def _expert_weights(w: Weights, source: str, num_experts: int) -> tuple[Callable, Callable]:
    """(gate_up (2 x d_ff, d_model) rows interleaved gate, up; down (d_model, d_ff)), each a
    function of the expert: dequantized from the MXFP4 blocks and scales, or transposed from
    the fused float tensors; either way the layer's stacked tensors are read once for all its
    experts (each expert's gate_up is read twice: its gate rows, its up rows)."""
    mxfp4 = w.has(f"{source}.gate_up_proj_blocks")
    parts = []
    for name, reads in (("gate_up_proj", 2), ("down_proj", 1)):
        inputs = ((w.get(f"{source}.{name}_blocks"), w.get(f"{source}.{name}_scales")) if mxfp4
                  else (w.get(f"{source}.{name}"),))
        require(inputs[0].shape[0] == num_experts, FAMILY_NAME,
                f"{source}.{name} of {inputs[0].shape[0]} experts for num_local_experts {num_experts}")
        if mxfp4:
            check_mxfp4(*inputs, f"{source}.{name}")
        shared = SharedRead(inputs, reads * num_experts)
        if mxfp4:  # (experts, out, in / 32, 16) blocks: expert e's (out, in)
            shape = (inputs[0].shape[1], inputs[0].shape[2] * BLOCK)
            parts.append(lambda e, shared=shared, shape=shape, name=name: shared.part(
                lambda blocks, scales: dequantize_mxfp4(blocks[e], scales[e], f"{source}.{name}"), shape))
        else:  # (experts, in, out): expert e's (out, in)
            shape = (inputs[0].shape[2], inputs[0].shape[1])
            parts.append(lambda e, shared=shared, shape=shape: shared.part(lambda t: t[e].T, shape))
    return parts[0], parts[1]


#: The kit's expert projection -> its name among one expert's tensors (``from_gguf``'s).
_SPLIT_NAMES = {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"}


def _copy_split_experts(out: StateDict, w: Weights, ff: str, source: str, num_experts: int) -> None:
    """Each expert's own tensors (``experts.{e}.gate_proj.weight`` (d_ff, d_model), its bias,
    ``up_proj``, ``down_proj``), taken unchanged."""
    extra = f"{source}.experts.{num_experts}.gate_proj.weight"
    require(not w.has(extra), FAMILY_NAME, f"{extra} beyond num_local_experts {num_experts}")
    for e in range(num_experts):
        for kit_name, name in _SPLIT_NAMES.items():
            copy_linear(out, f"{ff}.experts.{e}.{kit_name}", w, f"{source}.experts.{e}.{name}", bias=True)


def copy_experts(out: StateDict, w: Weights, cfg: ModelConfig, ours: str, theirs: str, i: int) -> None:
    """Layer ``i``'s ``mlp.router`` and ``mlp.experts`` -> ``feedforward.router`` and
    ``feedforward.experts.{e}.gate``/``up``/``down`` (weights and biases)."""
    ff, source = f"{ours}.feedforward", f"{theirs}.mlp"
    copy_linear(out, f"{ff}.router", w, f"{source}.router", bias=True)
    num_experts = cfg.feedforward.params["num_experts"]
    if w.has(f"{source}.experts.0.gate_proj.weight"):
        _copy_split_experts(out, w, ff, source, num_experts)
        return
    gate_up, down = _expert_weights(w, f"{source}.experts", num_experts)
    gate_up_bias = w.get(f"{source}.experts.gate_up_proj_bias")  # (experts, 2 x d_ff) interleaved
    down_bias = w.get(f"{source}.experts.down_proj_bias")  # (experts, d_model)
    for e in range(num_experts):
        both, expert = gate_up(e), f"{ff}.experts.{e}"  # (2 x d_ff, d_model): gate, up, gate, ...
        out[f"{expert}.gate.weight"], out[f"{expert}.up.weight"] = both[0::2], both[1::2]
        out[f"{expert}.gate.bias"] = gate_up_bias[e][0::2]
        out[f"{expert}.up.bias"] = gate_up_bias[e][1::2]
        out[f"{expert}.down.weight"], out[f"{expert}.down.bias"] = down(e), down_bias[e]


def gpt_oss_weights(hf: dict, w: Weights, cfg: ModelConfig) -> StateDict:
    """Llama's weights with the attention sinks and the experts."""
    out = llama_weights(hf, w, cfg, feedforward=copy_experts)
    for i in range(cfg.num_layers):
        out[f"decoder.layers.{i}.self_attention.kernel.sinks"] = w.get(f"layers.{i}.self_attn.sinks")
    return out


FAMILY = CheckpointFamily(FAMILY_NAME, gpt_oss_config, gpt_oss_weights, probe="embed_tokens.weight",
                          prefixes=("model.", ""), description="GptOssForCausalLM")
