"""A GGUF file's tensors under their Hugging Face names, read (dequantized to float32) only when
the model is filled, with what llama.cpp's converter did to them undone:

* the dims: GGUF lists them innermost first, (in, out) for a weight; PyTorch's order is
  (out, in), which is the order of the data (numpy's view of it already is);
* Llama's query and key rows, interleaved per head for llama.cpp's rotary
  (``LlamaModel.permute`` in convert_hf_to_gguf.py), put back in halves;
* Gemma's norm weights, stored as 1 + weight (its RMSNorm scales by 1 + weight);
* a mixture of experts' stacked experts (``blk.N.ffn_gate_exps`` / ``ffn_up_exps``: GGUF dims
  (in, rows, experts), PyTorch's (experts, rows, in); ``ffn_down_exps`` (experts, d_model,
  d_ff)), split into one Hugging Face tensor per expert (``mlp.experts.{e}.gate_proj.weight``
  (rows, in)), each read (and dequantized) alone from its slice of the file, so no layer's
  experts are ever held whole (gpt-oss's expert biases ``ffn_gate_exps.bias`` (experts, d_ff)
  are split the same way; its MXFP4 experts are dequantized by ``gguf.quants``, whose values
  equal transformers' ``convert_moe_packed_tensors``); Qwen2-MoE's shared expert gate
  ``ffn_gate_inp_shexp`` (d_model,) as transformers' (1, d_model).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import torch
from torch import Tensor

from transformer_kit.checkpoints.deferred import DeferredTensor
from transformer_kit.checkpoints.gguf.blocks import GgufBlocks
from transformer_kit.core.errors import CheckpointError

#: The architectures whose converter permutes the q and k rows (LlamaModel and its subclasses).
PERMUTED = frozenset({"llama", "mistral", "granite", "granitemoe", "smollm3"})
#: The architectures whose norm weights are stored with 1 added.
NORM_PLUS_ONE = frozenset({"gemma", "gemma2", "gemma3"})
#: Stored as plain floats (no blocks to keep).
FLOAT_TYPES = frozenset({"F32", "F16", "BF16", "F64"})

_GLOBAL = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_LAYER = {
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
    "attn_qkv": "self_attn.qkv_proj", "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm", "ffn_norm": "post_attention_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm", "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
    "ffn_gate_inp": "mlp.gate", "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj", "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
    "ffn_gate_exps": "mlp.experts.{e}.gate_proj", "ffn_up_exps": "mlp.experts.{e}.up_proj",
    "ffn_down_exps": "mlp.experts.{e}.down_proj",
}
#: GGUF vectors transformers holds as a matrix of one row.
_ROW = frozenset({"ffn_gate_inp_shexp"})
#: Per-architecture exceptions to :data:`_LAYER`.
_LAYER_BY_ARCH = {
    "gemma2": {"ffn_norm": "pre_feedforward_layernorm"},
    "gemma3": {"ffn_norm": "pre_feedforward_layernorm"},
    "phi3": {"ffn_up": "mlp.gate_up_proj"},
    # the router (with its bias) and each head's attention sink (``attn_sinks.weight``, which
    # transformers names without a suffix: ``self_attn.sinks``)
    "gpt-oss": {"ffn_gate_inp": "mlp.router", "attn_sinks": "self_attn.sinks"},
}
#: GGUF tensors (``{name}.weight``) whose Hugging Face name has no ``.weight``.
_NO_SUFFIX = frozenset({"attn_sinks"})
#: Tensors that hold no weight of the model (rotary factors the config describes).
_SKIPPED = re.compile(r"^(rope_freqs|rope_factors_long|rope_factors_short)\.weight$")
_NAME = re.compile(r"^(?:blk\.(\d+)\.)?([a-z_0-9]+)\.(weight|bias)$")


def hf_name(name: str, arch: str) -> str | None:
    """The Hugging Face name of GGUF tensor ``name`` (``blk.3.attn_q.weight`` ->
    ``model.layers.3.self_attn.q_proj.weight``); None for a tensor that is no weight. A stacked
    experts' tensor gives a name with ``{e}`` where each expert's index goes."""
    if _SKIPPED.match(name):
        return None
    match = _NAME.match(name)
    layer_names = {**_LAYER, **_LAYER_BY_ARCH.get(arch, {})}
    if match is None or (match[1] is None and match[2] not in _GLOBAL) or (
            match[1] is not None and match[2] not in layer_names):
        raise CheckpointError(f"The {arch} GGUF file holds a tensor {name!r} the kit does not map "
                              "(a variant of the architecture it does not know).")
    if match[1] is None:
        return f"{_GLOBAL[match[2]]}.{match[3]}"
    if match[2] in _NO_SUFFIX and match[3] == "weight":
        return f"model.layers.{match[1]}.{layer_names[match[2]]}"
    return f"model.layers.{match[1]}.{layer_names[match[2]]}.{match[3]}"


def unpermute_rows(rows: np.ndarray, heads: int) -> np.ndarray:
    """Undo ``LlamaModel.permute``: rows (heads * head_dim, ...) interleaved per head -> each
    head's first half of rotary pairs, then its second half (rows are moved whole, so a matrix of
    quantized blocks per row is unpermuted the same way)."""
    half = rows.shape[0] // heads // 2
    return rows.reshape(heads, half, 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


class GgufTensors:
    """The tensors of an opened GGUF file (``reader``) for the config dict ``hf``."""

    def __init__(self, reader: Any, arch: str, hf: dict[str, Any]) -> None:
        self.reader, self.arch = reader, arch
        self.by_name = {t.name: t for t in reader.tensors}
        self.heads = {"q_proj": hf["num_attention_heads"], "k_proj": hf["num_key_value_heads"]}
        self.names = {}  # Hugging Face name -> GGUF name
        self.experts: dict[str, int] = {}  # Hugging Face name of one expert -> its index
        for name, tensor in self.by_name.items():
            theirs = hf_name(name, arch)
            if theirs is None:
                continue
            if "{e}" not in theirs:
                self.names[theirs] = name
                continue
            for e in range(int(tensor.shape[-1])):  # GGUF's outermost dim: the experts
                self.names[theirs.format(e=e)] = name
                self.experts[theirs.format(e=e)] = e

    def _data(self, name: str) -> np.ndarray:
        """Hugging Face tensor ``name``'s stored values (a view of the file's memory map): the
        whole tensor, or one expert's slice of stacked experts."""
        data = np.asarray(self.by_name[self.names[name]].data)
        return data[self.experts[name]] if name in self.experts else data

    def _heads(self, name: str) -> int | None:
        """The head count to unpermute Hugging Face tensor ``name`` by, or None."""
        if self.arch not in PERMUTED:
            return None
        for proj, heads in self.heads.items():
            if f".self_attn.{proj}." in name:
                return heads
        return None

    def read(self, name: str) -> Tensor:
        """Hugging Face tensor ``name`` as float32, in PyTorch's layout, converter steps undone."""
        from gguf.quants import dequantize

        tensor = self.by_name[self.names[name]]
        try:
            values = dequantize(self._data(name), tensor.tensor_type)
        except (NotImplementedError, ValueError) as exc:
            raise CheckpointError(f"Cannot dequantize {tensor.name!r} ({tensor.tensor_type.name}) "
                                  f"in the GGUF file: {exc}") from None
        values = values.reshape(self.shape(name))
        heads = self._heads(name)
        if heads is not None:
            values = unpermute_rows(values, heads)
        values = np.ascontiguousarray(values, dtype=np.float32)
        if not values.flags.writeable:  # a float32 tensor: a view of the file's memory map
            values = values.copy()
        out = torch.from_numpy(values)
        if self.arch in NORM_PLUS_ONE and name.endswith("norm.weight"):
            out -= 1
        return out

    def shape(self, name: str) -> tuple[int, ...]:
        """Hugging Face tensor ``name``'s shape in PyTorch's order (GGUF's reversed; one
        expert's (rows, cols) of stacked experts; (1, d_model) for a row vector)."""
        gguf_name = self.names[name]
        shape = tuple(int(d) for d in reversed(self.by_name[gguf_name].shape.tolist()))
        if name in self.experts:
            return shape[1:]
        if _NAME.match(gguf_name)[2] in _ROW:
            return (1, int(np.prod(shape)))
        return shape

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """GGUF tensor name -> shape in PyTorch's order."""
        return {t.name: tuple(int(d) for d in reversed(t.shape.tolist())) for t in self.reader.tensors}

    def deferred(self) -> dict[str, Tensor]:
        """Every weight by Hugging Face name, as a :class:`DeferredTensor` (read when needed)."""
        return {name: DeferredTensor(torch.empty(self.shape(name), dtype=torch.float32, device="meta"),
                                     ("read", self.read, name))
                for name in self.names}

    def blocks(self, name: str) -> GgufBlocks | None:
        """Hugging Face tensor ``name``'s quantized blocks (rows unpermuted), or None for a
        float tensor or one that is not a matrix."""
        tensor = self.by_name[self.names[name]]
        type_name = tensor.tensor_type.name
        shape = self.shape(name)
        if type_name in FLOAT_TYPES or len(shape) != 2:
            return None
        data = self._data(name).reshape(shape[0], -1)
        heads = self._heads(name)
        if heads is not None:
            data = unpermute_rows(data, heads)
        return GgufBlocks(type_name, data, (shape[0], shape[1]))


def kit_blocks(state: dict[str, Tensor], tensors: GgufTensors) -> dict[str, GgufBlocks]:
    """Kit parameter name -> :class:`GgufBlocks` for every parameter the family mapping took
    unchanged from a quantized GGUF matrix (one it sliced or scaled has none)."""
    out: dict[str, GgufBlocks] = {}
    found: dict[str, GgufBlocks | None] = {}  # a tied weight: one GgufBlocks under both names
    for ours, tensor in state.items():
        recipe = getattr(tensor, "recipe", None)
        if recipe is not None and recipe[0] == "read" and recipe[1] == tensors.read:
            if recipe[2] not in found:
                found[recipe[2]] = tensors.blocks(recipe[2])
            if found[recipe[2]] is not None:
                out[ours] = found[recipe[2]]
    return out
