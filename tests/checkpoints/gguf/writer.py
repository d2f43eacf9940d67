"""Writing a transformers model as llama.cpp's convert_hf_to_gguf.py writes it (a test helper):
llama.cpp's tensor names (gguf's own TensorNameMap), dims in GGUF's order, Llama's q/k rows
permuted for llama.cpp's rotary, Gemma's norms stored as 1 + weight, the head left out when it is
the embedding, a mixture of experts' experts stacked per layer (``ffn_gate_exps`` /
``ffn_up_exps`` / ``ffn_down_exps``, the experts outermost) with its ``expert_*`` metadata, and
a tiny byte-level BPE vocabulary (or, for a model with as many tokens as
:func:`sentencepiece_vocabulary`, that Llama-style sentencepiece one). gpt-oss as
``GptOssModel`` writes it: the fused ``gate_up_proj`` (experts, d_model, 2 x d_ff), whose gate
and up columns interleave, de-interleaved into ``ffn_gate_exps`` and ``ffn_up_exps`` (and their
biases ``.bias``), the sinks as ``attn_sinks.weight``, YaRN's parameters as ``rope.scaling.*``,
and MXFP4 experts (the Hub's ``_blocks`` / ``_scales``) repacked into GGML's MXFP4 blocks
(:func:`mxfp4_to_ggml`), bytes moved, never requantized."""

from __future__ import annotations

import math
import re
from pathlib import Path

import gguf
import numpy as np
import torch

#: The architectures whose converter permutes the q and k rows (LlamaModel.permute).
PERMUTED = {"llama", "mistral", "granite", "granitemoe", "smollm3"}
NORM_PLUS_ONE = {"gemma", "gemma2", "gemma3"}
#: The vocabulary of the written files: three special tokens, single characters, then one merge.
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's ``LlamaModel.permute`` (each head's halves interleaved)."""
    return (weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def rope_freqs(cfg) -> np.ndarray:
    """llama.cpp's ``rope_freqs`` of a llama3 rotary scaling (as generate_extra_tensors writes it,
    in float32 as it computes it)."""
    rope = cfg.rope_parameters
    dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    freqs = 1.0 / (rope["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    context, low, high = (rope["original_max_position_embeddings"], rope["low_freq_factor"],
                          rope["high_freq_factor"])
    factors = []
    for freq in freqs.tolist():
        wavelen = 2 * math.pi / freq
        if wavelen < context / high:
            factors.append(1.0)
        elif wavelen > context / low:
            factors.append(rope["factor"])
        else:
            smooth = (context / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / rope["factor"] + smooth))
    return np.array(factors, np.float32)


def vocabulary(size: int) -> list[str]:
    letters = [chr(c) for c in range(ord("!"), ord("~") + 1)]
    return [*SPECIALS, *letters[:size - len(SPECIALS) - 1], '!"']


#: A sentencepiece vocabulary (Llama's kind): unknown, control, the 256 byte tokens, then pieces,
#: each with its score (higher merges first).
PIECES = {"\u2581": -1.0, "a": -2.0, "b": -3.0, "c": -4.0, "h": -5.0, "i": -6.0, "\u2581a": -7.0,
          "ab": -8.0, "\u2581ab": -9.0, "bc": -10.0, "\u2581h": -11.0, "\u2581hi": -12.0, "abc": -13.0}


def sentencepiece_vocabulary() -> tuple[list[str], list[float], list[int]]:
    """(tokens, scores, token types) of a small Llama-style sentencepiece vocabulary."""
    tokens = ["<unk>", "<s>", "</s>", *[f"<0x{b:02X}>" for b in range(256)], *PIECES]
    scores = [0.0] * 259 + list(PIECES.values())
    types = [2, 3, 3] + [6] * 256 + [1] * len(PIECES)  # UNKNOWN, CONTROL, BYTE, NORMAL
    return tokens, scores, types


def _sentencepiece(writer: gguf.GGUFWriter) -> None:
    tokens, scores, types = sentencepiece_vocabulary()
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)


def _metadata(writer: gguf.GGUFWriter, cfg, vocab: int) -> None:
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    rope = getattr(cfg, "rope_parameters", None) or {}
    rope = rope.get("full_attention", rope)  # Gemma 3's by layer type: llama.cpp writes the global one
    writer.add_rope_freq_base(float(rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))))
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_vocab_size(vocab)
    if vocab == len(sentencepiece_vocabulary()[0]):
        _sentencepiece(writer)
        return
    for name in ("attn_logit_softcapping", "final_logit_softcapping", "sliding_window"):
        if getattr(cfg, name, None) is not None:  # Gemma 2's
            getattr(writer, f"add_{name}")(getattr(cfg, name))
    for theirs, ours in (("attention_multiplier", "attention_scale"),
                         ("logits_scaling", "logit_scale"),
                         ("embedding_multiplier", "embedding_scale"),
                         ("residual_multiplier", "residual_scale")):
        if getattr(cfg, theirs, None) is not None:  # Granite's, as granite.py writes them
            getattr(writer, f"add_{ours}")(getattr(cfg, theirs))
    tokens = vocabulary(vocab)
    writer.add_tokenizer_model("gpt2")
    # gpt-oss's o200k vocabulary: the pre-tokenizer convert_hf_to_gguf.py recognises it by
    writer.add_tokenizer_pre("gpt-4o" if cfg.model_type == "gpt_oss" else "default")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
    writer.add_token_merges(['! "'])
    writer.add_bos_token_id(cfg.bos_token_id)
    writer.add_eos_token_id(cfg.eos_token_id)
    if cfg.pad_token_id is not None:
        writer.add_pad_token_id(cfg.pad_token_id)
    writer.add_add_bos_token(False)
    writer.add_chat_template("{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}")


_MOE_TENSOR = re.compile(r"^model\.layers\.(\d+)\.(?:mlp|block_sparse_moe|shared_mlp)\.(.+)$")
#: What follows a layer's mlp (block_sparse_moe, shared_mlp) -> llama.cpp's names of the parts
#: (a fused gate-and-up tensor is split in halves, the gate first, along its rows).
_MOE_NAMES = {
    "gate.weight": ("ffn_gate_inp",), "router.weight": ("ffn_gate_inp",),
    "router.layer.weight": ("ffn_gate_inp",),
    "experts.gate_up_proj": ("ffn_gate_exps", "ffn_up_exps"), "experts.down_proj": ("ffn_down_exps",),
    "shared_expert_gate.weight": ("ffn_gate_inp_shexp",),
    "shared_expert.gate_proj.weight": ("ffn_gate_shexp",),
    "shared_expert.up_proj.weight": ("ffn_up_shexp",),
    "shared_expert.down_proj.weight": ("ffn_down_shexp",),
    "input_linear.weight": ("ffn_gate_shexp", "ffn_up_shexp"),  # Granite's shared_mlp
    "output_linear.weight": ("ffn_down_shexp",),
    # a dense layer among sparse ones (Qwen-MoE's mlp_only_layers): gguf's map for qwen3moe lacks it
    "gate_proj.weight": ("ffn_gate",), "up_proj.weight": ("ffn_up",), "down_proj.weight": ("ffn_down",),
}


def moe_tensors(hf_name: str, data: np.ndarray) -> list[tuple[str, np.ndarray]] | None:
    """A mixture of experts' tensor, or a dense SwiGLU's beside them, as llama.cpp's tensors
    (transformers 5 holds the experts fused: ``gate_up_proj`` (experts, 2 x d_ff, d_model),
    ``down_proj`` (experts, d_model, d_ff)); None for another tensor. Shapes are numpy's,
    GGUF's reversed: ``ffn_gate_exps`` (experts, d_ff, d_model) is GGUF's {d_model, d_ff,
    experts}."""
    match = _MOE_TENSOR.match(hf_name)
    if match is None or match[2] not in _MOE_NAMES:
        return None
    names = _MOE_NAMES[match[2]]
    if names == ("ffn_gate_inp_shexp",):
        data = data.reshape(-1)  # (1, d_model) -> llama.cpp's {d_model}
    parts = np.split(data, len(names), axis=-2) if len(names) > 1 else [data]  # the gate's rows first
    return [(f"blk.{match[1]}.{name}.weight", np.ascontiguousarray(part))
            for name, part in zip(names, parts, strict=True)]


_GPT_OSS_EXPERTS = re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)(_bias)?$")


def mxfp4_to_ggml(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """The Hub's MXFP4 (blocks (..., rows, groups, 16) uint8: byte i holds value 2i in its low
    nibble and 2i + 1 in its high one; scales (..., rows, groups) E8M0) as GGML's MXFP4 rows
    (..., rows, groups * 17): per block the E8M0 byte, then 16 bytes whose byte j holds value j
    in its low nibble and value j + 16 in its high one (the same codes and exponent)."""
    codes = np.stack([blocks & 0x0F, blocks >> 4], axis=-1).reshape(*blocks.shape[:-1], 32)
    qs = codes[..., :16] | (codes[..., 16:] << 4)
    return np.concatenate([scales[..., None], qs], axis=-1).reshape(*scales.shape[:-1], -1)


def gpt_oss_tensors(hf_name: str, data: np.ndarray, mxfp4: dict | None = None
                    ) -> list[tuple[str, np.ndarray, gguf.GGMLQuantizationType | None]] | None:
    """gpt-oss's fused experts as llama.cpp's ``ffn_{gate,up,down}_exps`` (``.weight`` (experts,
    rows, in) numpy's order, ``.bias`` (experts, rows)), gate and up de-interleaved (the even
    columns of ``gate_up_proj`` are the gate's); from ``mxfp4[hf_name]`` = (blocks, scales) in
    the Hub's layout (rows already (experts, out, ...)) when given. None for another tensor."""
    match = _GPT_OSS_EXPERTS.match(hf_name)
    if match is None:
        return None
    prefix, bias = f"blk.{match[1]}", match[3] is not None
    names = ["ffn_gate_exps", "ffn_up_exps"] if match[2] == "gate_up_proj" else ["ffn_down_exps"]
    suffix = "bias" if bias else "weight"
    if not bias and mxfp4 and hf_name in mxfp4:
        blocks, scales = mxfp4[hf_name]
        parts = [(blocks[:, i::len(names)], scales[:, i::len(names)]) for i in range(len(names))]
        return [(f"{prefix}.{name}.{suffix}", np.ascontiguousarray(mxfp4_to_ggml(*part)),
                 gguf.GGMLQuantizationType.MXFP4) for name, part in zip(names, parts, strict=True)]
    if not bias:
        data = data.swapaxes(-1, -2)  # (experts, in, out) -> (experts, out, in)
    parts = [data[..., i::len(names), :] if not bias else data[..., i::len(names)]
             for i in range(len(names))]
    return [(f"{prefix}.{name}.{suffix}", np.ascontiguousarray(part), None)
            for name, part in zip(names, parts, strict=True)]


def _rope_metadata(writer: gguf.GGUFWriter, cfg) -> None:
    """YaRN's ``rope.scaling.*`` as ``TextModel.set_gguf_parameters`` writes them."""
    rope = getattr(cfg, "rope_parameters", None) or {}
    if rope.get("rope_type") != "yarn":
        return
    writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    writer.add_rope_scaling_factor(rope["factor"])
    writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    if rope.get("beta_fast") is not None:
        writer.add_rope_scaling_yarn_beta_fast(rope["beta_fast"])
    if rope.get("beta_slow") is not None:
        writer.add_rope_scaling_yarn_beta_slow(rope["beta_slow"])


def _expert_metadata(writer: gguf.GGUFWriter, cfg) -> None:
    """``{arch}.expert_*`` as llama.cpp's converter writes them."""
    count = getattr(cfg, "num_experts", None) or getattr(cfg, "num_local_experts", None)
    if not count:
        return
    writer.add_expert_count(count)
    writer.add_expert_used_count(cfg.num_experts_per_tok)
    if getattr(cfg, "moe_intermediate_size", None):
        writer.add_expert_feed_forward_length(cfg.moe_intermediate_size)
    if cfg.model_type == "gpt_oss":  # GptOssModel.set_gguf_parameters
        writer.add_expert_feed_forward_length(cfg.intermediate_size)
    shared = getattr(cfg, "shared_expert_intermediate_size", 0) or getattr(cfg, "shared_intermediate_size", 0)
    if shared:
        writer.add_expert_shared_feed_forward_length(shared)


def _add(writer: gguf.GGUFWriter, name: str, data: np.ndarray,
         quantized: dict[str, gguf.GGMLQuantizationType],
         raw: gguf.GGMLQuantizationType | None = None) -> None:
    if raw is not None:  # bytes already in that type's blocks
        writer.add_tensor(name, data, raw_dtype=raw)
    elif name in quantized:
        writer.add_tensor(name, gguf.quants.quantize(data, quantized[name]), raw_dtype=quantized[name])
    else:
        writer.add_tensor(name, data)


def _converted(data: np.ndarray, hf_name: str, cfg, arch: str, names: gguf.TensorNameMap,
               mxfp4: dict | None) -> list[tuple[str, np.ndarray, gguf.GGMLQuantizationType | None]]:
    """Hugging Face tensor ``hf_name`` as the converter writes it: (GGUF name, data, its raw
    type or None for floats), one or more."""
    if arch == "gpt-oss" and (parts := gpt_oss_tensors(hf_name, data, mxfp4)) is not None:
        return parts
    if hf_name.endswith(".self_attn.sinks"):  # GptOssModel.filter_tensors adds the suffix
        hf_name += ".weight"
    experts = moe_tensors(hf_name, data)
    if experts is not None:
        return [(name, part, None) for name, part in experts]
    name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
    assert name is not None, hf_name
    if arch in PERMUTED and ".q_proj." in hf_name:
        data = permute(data, cfg.num_attention_heads)
    if arch in PERMUTED and ".k_proj." in hf_name:
        data = permute(data, cfg.num_key_value_heads)
    if arch in NORM_PLUS_ONE and hf_name.endswith("norm.weight"):
        data = data + 1
    return [(name, data, None)]


def write_gguf(model: torch.nn.Module, path: Path, arch: str,
               quantized: dict[str, gguf.GGMLQuantizationType] | None = None,
               mxfp4: dict[str, tuple[np.ndarray, np.ndarray]] | None = None) -> Path:
    """``model`` (a transformers CausalLM) as the GGUF file ``path``; ``quantized``: GGUF tensor
    name -> the type it is stored in (the others: F32); ``mxfp4`` (gpt-oss): a fused expert
    tensor's Hugging Face name -> its MXFP4 (blocks, scales) in the Hub's layout, written
    repacked instead of its float values."""
    cfg = model.config
    quantized = quantized or {}
    model_arch = next(key for key, value in gguf.MODEL_ARCH_NAMES.items() if value == arch)
    names = gguf.get_tensor_name_map(model_arch, cfg.num_hidden_layers)
    writer = gguf.GGUFWriter(path, arch)
    _metadata(writer, cfg, cfg.vocab_size)
    _expert_metadata(writer, cfg)
    _rope_metadata(writer, cfg)
    for hf_name, tensor in model.state_dict().items():
        if hf_name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        for name, part, raw in _converted(tensor.float().numpy().copy(), hf_name, cfg, arch, names, mxfp4):
            _add(writer, name, part, quantized, raw)
    rope = getattr(cfg, "rope_parameters", None) or {}
    if rope.get("rope_type") == "llama3":
        writer.add_tensor("rope_freqs.weight", rope_freqs(cfg))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
