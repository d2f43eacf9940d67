"""Multi-head attention: the projections W_Q, W_K, W_V, W_O, grouped KV heads and the KV cache.

The kernel (a registered ``attention`` component) only combines q, k and v.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_kit.fused_ops import packed_attention_enabled
from transformer_kit.heads import repeat_kv_heads, split_heads
from transformer_kit.inputs import tracing
from transformer_kit.interfaces import PositionalEncoding


@dataclass
class LayerCache:
    """One layer's cached keys and values, plain tensors (exportable as graph inputs/outputs).

    key, value: (batch, kv_heads, past_len, head_dim); replaced by past + new after a call.
    cross_key, cross_value: (batch, kv_heads, src_len, head_dim), computed once per input.
    """

    key: Tensor
    value: Tensor
    cross_key: Tensor | None = None
    cross_value: Tensor | None = None


@dataclass
class AttentionInputs:
    """What an attention call needs besides its input; built once per stack call.

    mask: (batch, 1, q_len, k_len) bool, True = may attend, or None.
    q_positions: (batch, q_len) int64; k_positions: (batch, k_len) int64 (self-attention).
    bias: (batch, heads, q_len, k_len) additive score bias, or None.
    positional: the encoding whose ``rotate`` applies to q and k (self-attention only).
    memory: (batch, src_len, d_model) encoder output, for cross-attention.
    cache: this layer's cache, or None for uncached calls.
    """

    mask: Tensor | None
    q_positions: Tensor | None = None
    k_positions: Tensor | None = None
    bias: Tensor | None = None
    positional: PositionalEncoding | None = None
    memory: Tensor | None = None
    cache: LayerCache | None = None


class MultiHeadAttention(nn.Module):
    """Self- or cross-attention with ``num_heads`` query heads and ``num_kv_heads`` KV heads.

    Args:
        d_model: model width; split into num_heads heads of d_model // num_heads.
        num_heads: query heads.
        num_kv_heads: key/value heads (grouped-query attention); divides num_heads.
        kernel: the attention kernel combining q, k, v.
        is_cross: True for encoder-decoder attention (keys and values from the memory).
        bias: whether the projections have biases.
    """

    def __init__(self, d_model: int, num_heads: int, num_kv_heads: int, kernel: nn.Module,
                 *, is_cross: bool = False, bias: bool = True) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = d_model // num_heads
        self.is_cross = is_cross
        kv_width = num_kv_heads * self.head_dim
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, kv_width, bias=bias)
        self.v_proj = nn.Linear(d_model, kv_width, bias=bias)
        self.o_proj = nn.Linear(d_model, d_model, bias=bias)
        self.kernel = kernel

    def keys_values(self, source: Tensor) -> tuple[Tensor, Tensor]:
        """source (batch, len, d_model) -> keys, values (batch, kv_heads, len, head_dim)."""
        return (split_heads(self.k_proj(source), self.num_kv_heads),
                split_heads(self.v_proj(source), self.num_kv_heads))

    def _packs_for_export(self, inputs: AttentionInputs) -> bool:
        """Whether this call exports as one ``Attention`` op (see transformer_kit.fused_ops):
        self-attention with a kernel that allows it, no rotation and no score bias."""
        rotates = (inputs.positional is not None
                   and type(inputs.positional).rotate is not PositionalEncoding.rotate)
        return (not self.is_cross and getattr(self.kernel, "exports_packed", False)
                and inputs.bias is None and not rotates and packed_attention_enabled() and tracing())

    def _packed_forward(self, x: Tensor, inputs: AttentionInputs) -> Tensor:
        """The export path: attention on (batch, len, width) tensors. With a cache (decoding,
        a few rows) q, k and v come from one product over the concatenated weights, which reads
        them in one pass; without (full sequences, compute-bound) from three products, which
        saves splitting the result."""
        cache = inputs.cache
        if cache is None:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        else:
            weight = torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight])
            bias = None if self.q_proj.bias is None else torch.cat(
                [self.q_proj.bias, self.k_proj.bias, self.v_proj.bias])
            kv_width = self.num_kv_heads * self.head_dim
            q, k, v = F.linear(x, weight, bias).split(
                [self.q_proj.out_features, kv_width, kv_width], -1)
        mask, has_key = inputs.mask, None
        if mask is not None:
            has_key = mask.any(dim=-1, keepdim=True)  # (batch, 1, q_len, 1)
            mask = mask | ~has_key  # no all-masked row; its output is zeroed below, as the kernel does
            mask = mask.expand(mask.shape[0], 1, x.shape[1], mask.shape[-1])
        scale = self.kernel.scale if self.kernel.scale is not None else self.head_dim ** -0.5
        if cache is None:
            out = torch.ops.transformer_kit.packed_attention(
                q, k, v, mask, self.num_heads, self.num_kv_heads, scale)
        else:
            out, cache.key, cache.value = torch.ops.transformer_kit.packed_cached_attention(
                q, k, v, mask, cache.key, cache.value, self.num_heads, self.num_kv_heads, scale)
        if has_key is not None:
            out = out.masked_fill(~has_key[:, 0], 0.0)
        return self.o_proj(out)

    def forward(self, x: Tensor, inputs: AttentionInputs) -> Tensor:
        """x (batch, q_len, d_model) -> (batch, q_len, d_model)."""
        if self._packs_for_export(inputs):
            return self._packed_forward(x, inputs)
        q = split_heads(self.q_proj(x), self.num_heads)
        cache = inputs.cache
        if self.is_cross:
            if cache is not None and cache.cross_key is not None:
                k, v = cache.cross_key, cache.cross_value
            else:
                k, v = self.keys_values(inputs.memory)
                if cache is not None:
                    cache.cross_key, cache.cross_value = k, v
        else:
            k, v = self.keys_values(x)
            if inputs.positional is not None:
                q = inputs.positional.rotate(q, inputs.q_positions)
                k = inputs.positional.rotate(k, inputs.q_positions)  # new keys sit at the queries
            if cache is not None:
                k = torch.cat([cache.key, k], dim=2)
                v = torch.cat([cache.value, v], dim=2)
                cache.key, cache.value = k, v
        groups = self.num_heads // self.num_kv_heads
        k, v = repeat_kv_heads(k, groups), repeat_kv_heads(v, groups)
        if inputs.bias is None:
            out = self.kernel(q, k, v, mask=inputs.mask)
        else:
            out = self.kernel(q, k, v, mask=inputs.mask, bias=inputs.bias)
        batch, _, q_len, _ = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(batch, q_len, -1))
