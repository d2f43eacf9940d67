"""A GGUF file's metadata as the Hugging Face ``config.json`` dict of the same model, so the
checkpoint family ``from_hf`` uses maps it (llama.cpp writes ``{arch}.embedding_length`` where
config.json has ``hidden_size``; ``convert_hf_to_gguf.py`` is the other direction)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from transformer_kit.core.errors import CheckpointError

#: general.architecture -> config.json's model_type (llama.cpp writes SmolLM2, most Mistral
#: checkpoints and Mixtral as "llama": a llama file with ``llama.expert_count`` > 0 is Mixtral's;
#: a granitemoe file with a shared expert is GraniteMoeShared's).
MODEL_TYPES = {
    "llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3", "gemma": "gemma",
    "gemma2": "gemma2", "gemma3": "gemma3_text", "phi3": "phi3", "olmo2": "olmo2",
    "granite": "granite", "smollm3": "smollm3", "qwen3moe": "qwen3_moe", "qwen2moe": "qwen2_moe",
    "olmoe": "olmoe", "granitemoe": "granitemoe", "gpt-oss": "gpt_oss",
}

#: Metadata key (after ``{arch}.``) -> config.json key, for every architecture.
_COMMON = {
    "context_length": "max_position_embeddings",
    "block_count": "num_hidden_layers",
    "feed_forward_length": "intermediate_size",
    "embedding_length": "hidden_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "rope.freq_base": "rope_theta",
}
_TOKEN_IDS = {"bos_token_id": "bos_token_id", "eos_token_id": "eos_token_id",
              "padding_token_id": "pad_token_id", "unknown_token_id": "unk_token_id"}
#: GGUF rope scaling types -> config.json's rope_scaling type.
_ROPE_TYPES = {"linear": "linear", "yarn": "yarn"}


def _key(meta: dict, arch: str, name: str, default: Any = None) -> Any:
    return meta.get(f"{arch}.{name}", default)


def _one_per_model(value: Any, arch: str, name: str) -> Any:
    """A value llama.cpp may write per layer (``head_count_kv``): one number, or refused."""
    if isinstance(value, list):
        if len(set(value)) != 1:
            raise CheckpointError(f"{arch} GGUF file with {name} differing between layers "
                                  f"({sorted(set(value))}) is not supported.")
        return value[0]
    return value


def _gemma2(meta: dict, hf: dict, arch: str) -> None:
    for name in ("attn_logit_softcapping", "final_logit_softcapping"):
        if _key(meta, arch, name) is not None:
            hf[name] = _key(meta, arch, name)
    if _key(meta, arch, "attention.sliding_window") is not None:
        hf["sliding_window"] = _key(meta, arch, "attention.sliding_window")
    hf["query_pre_attn_scalar"] = hf["head_dim"]
    hf["hidden_activation"] = "gelu_pytorch_tanh"


def _gemma(meta: dict, hf: dict, arch: str) -> None:
    hf["hidden_activation"] = "gelu_pytorch_tanh"


#: Every even layer of a gpt-oss file slides (llama.cpp's ``set_swa_pattern(2)`` for
#: LLM_ARCH_OPENAI_MOE; transformers' default ``layer_types`` of GptOssConfig too).
_GPT_OSS_SWA_PATTERN = 2
#: YaRN metadata llama.cpp's converter may write that has no place in transformers' gpt-oss
#: config, with the value that means "as transformers computes it" (None: any value is refused).
_GPT_OSS_YARN_UNMAPPED = {"rope.scaling.yarn_attn_factor": None, "rope.scaling.yarn_ext_factor": 1.0,
                          "rope.scaling.yarn_log_multiplier": 0.0}


def _gpt_oss(meta: dict, hf: dict, arch: str) -> None:
    """gpt-oss (llama.cpp's LLM_ARCH_OPENAI_MOE): the sliding window and which layers it applies
    to, and transformers' YaRN without the truncation of its correction range (``truncate``:
    false, as GptOssConfig writes it). The clamped SwiGLU's alpha (1.702) and limit (7.0) are
    constants of llama.cpp's graph, unwritten: the family's defaults are the same."""
    window = _key(meta, arch, "attention.sliding_window")
    if not (isinstance(window, int) and window > 0):
        raise CheckpointError(f"{arch} GGUF file with attention.sliding_window {window!r} is not "
                              "supported (a positive number of tokens; llama.cpp requires it).")
    hf["sliding_window"] = window
    hf["layer_types"] = ["sliding_attention" if i % _GPT_OSS_SWA_PATTERN < _GPT_OSS_SWA_PATTERN - 1
                         else "full_attention" for i in range(hf["num_hidden_layers"])]
    for name, neutral in _GPT_OSS_YARN_UNMAPPED.items():
        value = _key(meta, arch, name)
        if value is not None and value != neutral:
            raise CheckpointError(f"{arch} GGUF file with {name} {value!r} is not supported "
                                  "(transformers' gpt-oss YaRN has no such parameter).")
    if (hf.get("rope_scaling") or {}).get("rope_type") == "yarn":
        hf["rope_scaling"]["truncate"] = False


def _granite(meta: dict, hf: dict, arch: str) -> None:
    for gguf_name, hf_name in (("attention.scale", "attention_multiplier"),
                               ("embedding_scale", "embedding_multiplier"),
                               ("residual_scale", "residual_multiplier"),
                               ("logit_scale", "logits_scaling")):
        if _key(meta, arch, gguf_name) is not None:
            hf[hf_name] = _key(meta, arch, gguf_name)


def _smollm3(meta: dict, hf: dict, arch: str) -> None:
    # llama.cpp skips rotary on every 4th layer (SmolLM3's no_rope_layer_interval), unwritten
    hf["no_rope_layers"] = [int((i + 1) % 4 != 0) for i in range(hf["num_hidden_layers"])]


def _phi3(meta: dict, hf: dict, arch: str) -> None:
    dims = _key(meta, arch, "rope.dimension_count")
    if dims is not None and dims != hf["head_dim"]:
        hf["partial_rotary_factor"] = dims / hf["head_dim"]
    if _key(meta, arch, "attention.sliding_window") is not None:
        hf["sliding_window"] = _key(meta, arch, "attention.sliding_window")


_EXTRA: dict[str, Callable[[dict, dict, str], None]] = {
    "gemma": _gemma, "gemma2": _gemma2, "gemma3": _gemma2, "granite": _granite,
    "granitemoe": _granite, "smollm3": _smollm3, "phi3": _phi3, "gpt-oss": _gpt_oss,
}

#: The mixture-of-experts architectures: general.architecture -> (config.json's name of the
#: expert count, of the shared expert's width, norm_topk_prob as llama.cpp computes it: the
#: ``norm_w`` its graph passes to ``build_moe_ffn``, fixed per architecture whatever
#: config.json said, or None where the family decides (Mixtral always renormalises; Granite's
#: softmax over the top-k logits is renormalised by construction)).
_MOE = {
    "qwen3moe": ("num_experts", None, True),
    "qwen2moe": ("num_experts", "shared_expert_intermediate_size", False),
    "olmoe": ("num_experts", None, False),
    "llama": ("num_local_experts", None, None),
    "granitemoe": ("num_local_experts", "shared_intermediate_size", None),
    "gpt-oss": ("num_local_experts", None, None),  # softmax over the top-k logits: normalised
}
#: (general.architecture, whether it has a shared expert) -> model_type, where it is not
#: :data:`MODEL_TYPES`'s.
_MOE_MODEL_TYPES = {("llama", False): "mixtral", ("llama", True): "mixtral",
                    ("granitemoe", True): "granitemoeshared"}


#: Architectures whose llama.cpp graph fixes the router, whatever the metadata says.
_FIXED_ROUTERS = frozenset({"gpt-oss"})


def _rows(tensors: dict[str, tuple[int, ...]], name: str) -> int | None:
    """The output width of a layer's GGUF tensor ``name`` (the first layer that has it): the
    rows of a matrix, the middle dim of stacked experts (experts, rows, cols)."""
    for key in sorted(tensors):
        if key.endswith(f".{name}.weight"):
            return tensors[key][-2]
    return None


def _routing(meta: dict, arch: str) -> tuple[int, int]:
    """(expert_count, expert_used_count), refused where llama.cpp's router is one the ``moe``
    component does not compute: ``build_moe_ffn`` scales the chosen weights by
    ``expert_weights_scale`` when it is neither 0 nor 1, and routes by ``expert_gating_func``
    when written (1: softmax). A gpt-oss graph reads neither: it always takes the softmax of
    the top-k logits (LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX_WEIGHT), unscaled."""
    count, used = _key(meta, arch, "expert_count", 0), _key(meta, arch, "expert_used_count", 0)
    if not (isinstance(count, int) and isinstance(used, int) and 1 <= used <= count):
        raise CheckpointError(f"{arch} GGUF file with expert_count {count!r} and expert_used_count "
                              f"{used!r} is not supported (1 <= expert_used_count <= expert_count).")
    if arch in _FIXED_ROUTERS:
        return count, used
    scale = _key(meta, arch, "expert_weights_scale", 0.0)
    gating = _key(meta, arch, "expert_gating_func", 1)
    if scale not in (0.0, 1.0) or gating != 1:
        raise CheckpointError(f"{arch} GGUF file with expert_weights_scale {scale!r} and "
                              f"expert_gating_func {gating!r} is not supported (the kit maps an "
                              "unscaled softmax router: scale 0 or 1, gating 1).")
    return count, used


def _dense_layers(hf: dict, arch: str, tensors: dict[str, tuple[int, ...]]) -> None:
    """Layers without a router (``blk.N.ffn_gate_inp``) as Qwen-MoE's ``mlp_only_layers``;
    refused for the other architectures, whose families have no dense layers."""
    dense = [i for i in range(hf["num_hidden_layers"]) if f"blk.{i}.ffn_gate_inp.weight" not in tensors]
    if dense and arch not in ("qwen3moe", "qwen2moe"):
        raise CheckpointError(f"{arch} GGUF file with layers without experts (no blk.N.ffn_gate_inp "
                              f"in layers {dense}) is not supported.")
    if dense:
        hf["mlp_only_layers"] = dense


def _experts(meta: dict, hf: dict, arch: str, tensors: dict[str, tuple[int, ...]]) -> None:
    """The mixture of experts' config.json keys from ``{arch}.expert_*`` and the stacked expert
    tensors (``blk.N.ffn_{gate,up,down}_exps``: (experts, rows, cols) in PyTorch's order); a
    llama file without experts is left alone."""
    if arch not in _MOE or (arch == "llama" and not _key(meta, arch, "expert_count", 0)):
        return
    count_key, shared_key, normalize = _MOE[arch]
    hf[count_key], hf["num_experts_per_tok"] = _routing(meta, arch)
    _dense_layers(hf, arch, tensors)
    if arch == "gpt-oss":  # the converter writes each expert's width as both
        hf["intermediate_size"] = (_key(meta, arch, "expert_feed_forward_length")
                                   or _rows(tensors, "ffn_gate_exps"))
    hf.setdefault("intermediate_size", _rows(tensors, "ffn_gate_exps"))  # each expert's, unwritten
    if normalize is not None:
        hf["norm_topk_prob"] = normalize
    if arch in ("qwen3moe", "qwen2moe"):  # the routed experts' own width
        hf["moe_intermediate_size"] = (_key(meta, arch, "expert_feed_forward_length")
                                       or _rows(tensors, "ffn_gate_exps"))
        hf["qkv_bias"] = hf["attention_bias"]  # Qwen2-MoE's name of it
    shared = _key(meta, arch, "expert_shared_feed_forward_length") or _rows(tensors, "ffn_gate_shexp") or 0
    if shared_key is not None:
        hf[shared_key] = shared
    hf["model_type"] = _MOE_MODEL_TYPES.get((arch, bool(shared)), hf["model_type"])


#: Llama 3.1-3.3's rotary scaling, but the factor: the only one llama.cpp's converter is given.
_LLAMA3 = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def llama3_factors(base: float, dim: int, factor: float, low_freq_factor: float,
                   high_freq_factor: float, original_max_position_embeddings: int) -> np.ndarray:
    """(dim / 2,) the rotary wavelength factors llama.cpp's converter writes as ``rope_freqs``
    for a ``llama3`` scaling (``LlamaModel.generate_extra_tensors``)."""
    wavelen = 2 * math.pi * base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    context = original_max_position_embeddings
    low, high = context / low_freq_factor, context / high_freq_factor
    smooth = (context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    between = 1 / ((1 - smooth) / factor + smooth)
    return np.where(wavelen < high, 1.0, np.where(wavelen > low, factor, between))


def _from_rope_freqs(hf: dict, arch: str, rope_freqs: np.ndarray) -> None:
    """Llama 3.1's scaling from the factors llama.cpp stored for it (the factor is their largest,
    the other parameters Llama 3's), or refused when the factors are not those."""
    spec = {**_LLAMA3, "factor": float(rope_freqs.max())}
    expected = llama3_factors(hf.get("rope_theta", 10000.0), hf["head_dim"], **spec)
    if expected.shape != rope_freqs.shape or not np.allclose(expected, rope_freqs, rtol=1e-5):
        raise CheckpointError(
            f"{arch} GGUF file with a rope_freqs tensor (precomputed rotary frequency factors) that "
            "are not Llama 3's llama3 scaling is not supported; load the Hugging Face checkpoint "
            "with tk.from_hf.")
    hf["rope_scaling"] = {"rope_type": "llama3", **spec}


def _rope_scaling(meta: dict, hf: dict, arch: str, rope_freqs: np.ndarray | None) -> None:
    kind = _key(meta, arch, "rope.scaling.type", "none")
    if rope_freqs is not None:
        _from_rope_freqs(hf, arch, rope_freqs)
        return
    if kind in ("none", None):
        return
    if kind not in _ROPE_TYPES:
        raise CheckpointError(f"{arch} GGUF file with rope.scaling.type {kind!r} is not supported "
                              f"(the kit maps {', '.join(_ROPE_TYPES)}).")
    scaling: dict[str, Any] = {"rope_type": _ROPE_TYPES[kind],
                               "factor": _key(meta, arch, "rope.scaling.factor", 1.0)}
    for gguf_name, hf_name in (("original_context_length", "original_max_position_embeddings"),
                               ("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow")):
        if _key(meta, arch, f"rope.scaling.{gguf_name}") is not None:
            scaling[hf_name] = _key(meta, arch, f"rope.scaling.{gguf_name}")
    hf["rope_scaling"] = scaling


def hf_config(meta: dict[str, Any], tensors: dict[str, tuple[int, ...]],
              rope_freqs: np.ndarray | None = None) -> dict[str, Any]:
    """The config.json dict of the model a GGUF file holds.

    Args:
        meta: the file's metadata (``general.architecture``, ``{arch}.block_count``, ...).
        tensors: GGUF tensor name -> shape in PyTorch's order (``attn_q.weight``: (out, in)),
            for what the metadata leaves out (tied head, head width, vocabulary size).
        rope_freqs: (head_dim / 2,) the file's ``rope_freqs`` tensor, where it has one.

    Raises:
        CheckpointError: an architecture outside :data:`MODEL_TYPES`, or metadata it needs
            missing.
    """
    arch = meta.get("general.architecture")
    if arch not in MODEL_TYPES:
        raise CheckpointError(f"GGUF architecture {arch!r} is not supported; the kit reads "
                              f"{', '.join(sorted(MODEL_TYPES))}.")
    hf: dict[str, Any] = {"model_type": MODEL_TYPES[arch]}
    for gguf_name, hf_name in _COMMON.items():
        value = _key(meta, arch, gguf_name)
        if value is not None:
            hf[hf_name] = _one_per_model(value, arch, gguf_name)
    for required in ("hidden_size", "num_hidden_layers", "num_attention_heads"):
        if required not in hf:
            raise CheckpointError(f"The {arch} GGUF file lacks the metadata that gives {required} "
                                  "(see llama.cpp's convert_hf_to_gguf.py); write it again.")
    if "token_embd.weight" not in tensors:
        raise CheckpointError(f"The {arch} GGUF file has no token_embd.weight tensor.")
    hf["vocab_size"] = tensors["token_embd.weight"][0]
    hf["tie_word_embeddings"] = "output.weight" not in tensors
    heads = hf["num_attention_heads"]
    q_rows = (tensors.get("blk.0.attn_q.weight") or (0,))[0]
    hf["head_dim"] = _key(meta, arch, "attention.key_length") or (q_rows // heads if q_rows
                                                                   else hf["hidden_size"] // heads)
    hf.setdefault("num_key_value_heads", heads)
    hf["attention_bias"] = "blk.0.attn_q.bias" in tensors
    for gguf_name, hf_name in _TOKEN_IDS.items():
        if meta.get(f"tokenizer.ggml.{gguf_name}") is not None:
            hf[hf_name] = meta[f"tokenizer.ggml.{gguf_name}"]
    hf.setdefault("eos_token_id", None)
    _rope_scaling(meta, hf, arch, rope_freqs)
    if arch in _EXTRA:
        _EXTRA[arch](meta, hf, arch)
    _experts(meta, hf, arch, tensors)
    return hf
