"""Packed attention: an export-time rewrite, applied while a model is traced and undone after.

While :func:`packed_attention_patch` is active, every self-attention module whose kernel's
component declares the ``"attention"`` lowering (``Component.lowerings``) runs
:func:`packed_forward` instead of its own forward: the projections, then one custom torch op on
(batch, len, heads * head_dim) tensors that exports as one ONNX ``Attention`` node (opset 23),
with the key/value cache concatenated inside it, instead of reshapes, transposes, KV repeats
and concats. A positional encoding that declares the ``"rotary"`` lowering turns q and k
through one ONNX ``RotaryEmbedding`` op each, on the packed heads; calls with another rotation
or a score bias keep the module's own forward.

Eager PyTorch never sees any of this: the patch exists only inside the export, as optimum's
model patchers do, and every export is verified against the unpatched model.
"""

from __future__ import annotations

import contextlib
import functools

import torch
import torch.nn.functional as F
from onnxscript import opset23 as op
from torch import Tensor, nn

from transformer_kit.attention import MultiHeadAttention
from transformer_kit.export.patching import declares, entries, packed_parameters, patched_forwards
from transformer_kit.heads import repeat_kv_heads, split_heads
from transformer_kit.interfaces import AttentionInputs, PositionalEncoding

#: The first opset whose Attention op the translations use.
PACKED_ATTENTION_OPSET = 23
#: The lowering a kernel's component declares to be packed (see ``Component.lowerings``).
LOWERING = "attention"
#: The lowering a positional encoding declares for rotating q and k in packed heads.
ROTARY_LOWERING = "rotary"


def _rotate_halves(x: Tensor, cos: Tensor, sin: Tensor, rotary_dim: int) -> Tensor:
    """x (batch, heads, len, dim), cos, sin (batch, 1, len, rotary_dim / 2): the GPT-NeoX turn."""
    half = rotary_dim // 2
    first, second, rest = x[..., :half], x[..., half:rotary_dim], x[..., rotary_dim:]
    return torch.cat([first * cos - second * sin, second * cos + first * sin, rest], dim=-1)


@torch.library.custom_op("transformer_kit::packed_rotary", mutates_args=())
def packed_rotary(x: Tensor, cos: Tensor, sin: Tensor, num_heads: int, rotary_dim: int) -> Tensor:
    """x (batch, len, num_heads * dim), cos, sin (batch, len, rotary_dim / 2) -> x with each
    head's first ``rotary_dim`` features turned by the angles (halves layout)."""
    turned = _rotate_halves(split_heads(x, num_heads), cos[:, None], sin[:, None], rotary_dim)
    return turned.transpose(1, 2).reshape(x.shape)


@packed_rotary.register_fake
def _(x: Tensor, cos: Tensor, sin: Tensor, num_heads: int, rotary_dim: int) -> Tensor:
    return torch.empty_like(x)


def _attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, num_heads: int,
            scale: float, softcap: float) -> Tensor:
    """q (batch, heads, q_len, dim), k, v (batch, kv_heads, k_len, dim) -> (batch, q_len, width);
    ``softcap`` > 0 bounds the scaled scores as softcap * tanh(score / softcap) (0: none)."""
    groups = num_heads // k.shape[1]
    k, v = repeat_kv_heads(k, groups), repeat_kv_heads(v, groups)
    if softcap > 0:
        scores = torch.tanh(torch.matmul(q, k.transpose(-2, -1)) * scale / softcap) * softcap
        if mask is not None:
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        out = torch.matmul(scores.softmax(-1), v)
    else:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    return out.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)


@torch.library.custom_op("transformer_kit::packed_attention", mutates_args=())
def packed_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, num_heads: int,
                     kv_heads: int, scale: float, softcap: float) -> Tensor:
    """q (batch, q_len, num_heads * dim), k, v (batch, k_len, kv_heads * dim), mask (batch, 1,
    q_len, k_len) bool (True = may attend; every row has a visible key) -> (batch, q_len, width)."""
    return _attend(split_heads(q, num_heads), split_heads(k, kv_heads), split_heads(v, kv_heads),
                   mask, num_heads, scale, softcap)


@packed_attention.register_fake
def _(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, num_heads: int, kv_heads: int,
      scale: float, softcap: float) -> Tensor:
    return torch.empty_like(q)


@torch.library.custom_op("transformer_kit::packed_cached_attention", mutates_args=())
def packed_cached_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None,
                            past_key: Tensor, past_value: Tensor, num_heads: int, kv_heads: int,
                            scale: float, softcap: float) -> tuple[Tensor, Tensor, Tensor]:
    """As :func:`packed_attention` after the cache: past_key, past_value (batch, kv_heads,
    past_len, dim); the mask covers past_len + q_len keys. Returns the output and the cache
    extended by the new keys and values (batch, kv_heads, past_len + q_len, dim)."""
    key = torch.cat([past_key, split_heads(k, kv_heads)], dim=2)
    value = torch.cat([past_value, split_heads(v, kv_heads)], dim=2)
    return _attend(split_heads(q, num_heads), key, value, mask, num_heads, scale, softcap), key, value


@packed_cached_attention.register_fake
def _(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, past_key: Tensor, past_value: Tensor,
      num_heads: int, kv_heads: int, scale: float, softcap: float) -> tuple[Tensor, Tensor, Tensor]:
    batch, new, _ = k.shape
    _, heads, past, dim = past_key.shape
    total = past + new
    return (torch.empty_like(q), past_key.new_empty(batch, heads, total, dim),
            past_value.new_empty(batch, heads, total, dim))


def packed_forward(self: MultiHeadAttention, x: Tensor, inputs: AttentionInputs,
                   rotary_lowered: bool = False) -> Tensor:
    """``MultiHeadAttention.forward`` as one packed op: x (batch, q_len, d_model) -> same.

    In a generating model q, k and v come from one product over the concatenated weights, which
    reads them in one pass, in every graph (so the graphs share that one matrix in
    ``weights.data``); an encoder's single graph keeps the three products (compute-bound full
    sequences, where splitting one result measured no faster).
    ``rotary_lowered``: the positional encoding declares the ``"rotary"`` lowering, so its
    turn of q and k is packed too.
    """
    rotates = (inputs.positional is not None
               and type(inputs.positional).rotate is not PositionalEncoding.rotate)
    if inputs.bias is not None or (rotates and not rotary_lowered):
        return MultiHeadAttention.forward(self, x, inputs)
    cache = inputs.cache
    weight, bias = packed_parameters(self, "packed_qkv")
    if weight is None:  # an encoder: one compute-bound graph, three products
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
    else:
        kv_width = self.num_kv_heads * self.head_dim
        q, k, v = F.linear(x, weight, bias).split(
            [self.q_proj.out_features, kv_width, kv_width], -1)
    if self.qk_norm is not None:
        q, k = self.qk_norm(q, k)
    if rotates:
        positional = inputs.positional
        if hasattr(positional, "cos_sin"):  # (batch, q_len, rd/2), scaled frequencies included
            cos, sin = positional.cos_sin(inputs.q_positions)
        else:  # a plugin's rotary encoding with inv_freq and rotary_dim only
            angles = inputs.q_positions[..., None].float() * positional.inv_freq
            cos, sin = angles.cos(), angles.sin()
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
        q = torch.ops.transformer_kit.packed_rotary(q, cos, sin, self.num_heads, positional.rotary_dim)
        k = torch.ops.transformer_kit.packed_rotary(k, cos, sin, self.num_kv_heads, positional.rotary_dim)
    mask, has_key = inputs.mask, None
    if mask is not None:
        has_key = mask.any(dim=-1, keepdim=True)  # (batch, 1, q_len, 1)
        mask = mask | ~has_key  # no all-masked row; its output is zeroed below, as the kernel does
        # (in an uncached call)
        mask = mask.expand(mask.shape[0], 1, x.shape[1], mask.shape[-1])
    scale = self.kernel.scale if self.kernel.scale is not None else self.head_dim ** -0.5
    softcap = getattr(self.kernel, "softcap", None) or 0.0
    if cache is None:
        out = torch.ops.transformer_kit.packed_attention(
            q, k, v, mask, self.num_heads, self.num_kv_heads, scale, softcap)
    else:
        out, cache.key, cache.value = torch.ops.transformer_kit.packed_cached_attention(
            q, k, v, mask, cache.key, cache.value, self.num_heads, self.num_kv_heads, scale, softcap)
    if has_key is not None and cache is None:
        # a cached call (a decoding step) leaves a padding query's output as it is: nothing real
        # attends to a padding key, and a step's logits are real positions' (one Where a layer
        # less in the step graph; its padding columns of the cache are not PyTorch's then)
        out = out.masked_fill(~has_key[:, 0], 0.0)
    return self.o_proj(out)


def rotations_lowered(model: nn.Module) -> bool:
    """Whether every positional encoding of ``model`` that rotates q and k (the top-level one
    and each layer variant's) declares the ``"rotary"`` lowering; one that does not rotate (a
    layer without positions) needs none."""
    def rotates(entry) -> bool:
        factory = entry.component.factory
        return not (isinstance(factory, type) and issubclass(factory, PositionalEncoding)
                    and factory.rotate is PositionalEncoding.rotate)
    return all(ROTARY_LOWERING in entry.component.lowerings
               for entry in entries(model, "positional") if rotates(entry))


def lowers_attention(model: nn.Module) -> bool:
    """Whether ``model``'s attention component declares the packed lowering."""
    return declares(model, "attention", LOWERING)


def packed_attention_patch(model: nn.Module, enabled: bool = True
                           ) -> contextlib.AbstractContextManager[int]:
    """While active, ``model``'s self-attention modules run :func:`packed_forward` (when
    ``enabled`` and the attention component declares the lowering), with q, k and v weights as
    one constant matrix in a generating model; yields how many modules were patched. Every
    module gets its own forward back on exit, whatever happened."""
    patched = []
    if enabled and lowers_attention(model):
        patched = [m for m in model.modules() if isinstance(m, MultiHeadAttention) and not m.is_cross]
    forward = functools.partial(packed_forward, rotary_lowered=rotations_lowered(model))
    pack_qkv = getattr(model, "architecture", None) != "encoder"
    return patched_forwards(patched, forward, "packed_qkv",
                            (lambda m: [m.q_proj, m.k_proj, m.v_proj]) if pack_qkv else None)


# -- ONNX translations -------------------------------------------------------------------------
def packed_attention_onnx(q, k, v, mask, num_heads: int, kv_heads: int, scale: float,
                          softcap: float):
    out, _, _, _ = op.Attention(q, k, v, mask, q_num_heads=num_heads, kv_num_heads=kv_heads,
                                scale=scale, softcap=softcap)
    return out


def packed_cached_attention_onnx(q, k, v, mask, past_key, past_value, num_heads: int,
                                 kv_heads: int, scale: float, softcap: float):
    out, present_key, present_value, _ = op.Attention(
        q, k, v, mask, past_key, past_value, q_num_heads=num_heads, kv_num_heads=kv_heads,
        scale=scale, softcap=softcap)
    return out, present_key, present_value


def packed_rotary_onnx(x, cos, sin, num_heads: int, rotary_dim: int):
    return op.RotaryEmbedding(x, cos, sin, interleaved=0, num_heads=num_heads,
                              rotary_embedding_dim=rotary_dim)


def packed_attention_translations() -> dict:
    """{custom op: onnxscript translation} for ``torch.onnx.export``."""
    return {
        torch.ops.transformer_kit.packed_rotary.default: packed_rotary_onnx,
        torch.ops.transformer_kit.packed_attention.default: packed_attention_onnx,
        torch.ops.transformer_kit.packed_cached_attention.default: packed_cached_attention_onnx,
    }
