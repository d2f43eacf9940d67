"""Multi-head attention: the projections W_Q, W_K, W_V, W_O, grouped KV heads and the KV cache.

The kernel (a registered ``attention`` component) only combines q, k and v. The heads' layout
(:func:`split_heads`, :func:`repeat_kv_heads`) is this module's too.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from transformer_kit.core.interfaces import AttentionInputs, AttentionWeights, LayerCache
from transformer_kit.core.masks import masked_softmax

__all__ = ["AttentionInputs", "AttentionWeights", "LayerCache", "MultiHeadAttention"]


def split_heads(x: Tensor, heads: int) -> Tensor:
    """(batch, len, heads * head_dim) -> (batch, heads, len, head_dim), a view."""
    batch, length, width = x.shape
    return x.view(batch, length, heads, width // heads).transpose(1, 2)


def repeat_kv_heads(x: Tensor, groups: int) -> Tensor:
    """(batch, kv_heads, len, dim) -> (batch, kv_heads * groups, len, dim), each head repeated
    ``groups`` times in place (a view and one copy; exports with static shapes)."""
    if groups == 1:
        return x
    batch, heads, length, dim = x.shape
    return x[:, :, None].expand(batch, heads, groups, length, dim).reshape(
        batch, heads * groups, length, dim)


class MultiHeadAttention(nn.Module):
    """Self- or cross-attention with ``num_heads`` query heads and ``num_kv_heads`` KV heads.

    Args:
        d_model: model width; projected to num_heads heads of ``head_dim`` (d_model // num_heads
            by default) and back.
        num_heads: query heads.
        num_kv_heads: key/value heads (grouped-query attention); divides num_heads.
        kernel: the attention kernel combining q, k, v.
        is_cross: True for encoder-decoder attention (keys and values from the memory).
        bias: whether the projections have biases.
        out_bias: whether the output projection has one (None: as ``bias``; Qwen2 has biases
            on q, k and v only).
        head_dim: each head's width (T5's d_kv); None: d_model // num_heads.
        qk_norm: a ``qk_norm`` component (self-attention only): ``(q, k) -> (q, k)`` on the
            projections' outputs, before the heads are split and turned by rotary.
    """

    def __init__(self, d_model: int, num_heads: int, num_kv_heads: int, kernel: nn.Module,
                 *, is_cross: bool = False, bias: bool = True, out_bias: bool | None = None,
                 head_dim: int | None = None, qk_norm: nn.Module | None = None) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim or d_model // num_heads
        self.is_cross = is_cross
        width, kv_width = num_heads * self.head_dim, num_kv_heads * self.head_dim
        self.q_proj = nn.Linear(d_model, width, bias=bias)
        self.k_proj = nn.Linear(d_model, kv_width, bias=bias)
        self.v_proj = nn.Linear(d_model, kv_width, bias=bias)
        self.o_proj = nn.Linear(width, d_model, bias=bias if out_bias is None else out_bias)
        self.kernel = kernel
        self.qk_norm = qk_norm

    def keys_values(self, source: Tensor) -> tuple[Tensor, Tensor]:
        """source (batch, len, d_model) -> keys, values (batch, kv_heads, len, head_dim)."""
        return (split_heads(self.k_proj(source), self.num_kv_heads),
                split_heads(self.v_proj(source), self.num_kv_heads))

    def forward(self, x: Tensor, inputs: AttentionInputs) -> Tensor:
        """x (batch, q_len, d_model) -> (batch, q_len, d_model)."""
        q, cache = self.q_proj(x), inputs.cache
        if self.is_cross:
            q = split_heads(q, self.num_heads)
            if cache is not None and cache.cross_key is not None:
                k, v = cache.cross_key, cache.cross_value
            else:
                k, v = self.keys_values(inputs.memory)
                if cache is not None:
                    cache.cross_key, cache.cross_value = k, v
        else:
            k, v = self.k_proj(x), self.v_proj(x)
            if self.qk_norm is not None:
                q, k = self.qk_norm(q, k)
            q, k = split_heads(q, self.num_heads), split_heads(k, self.num_kv_heads)
            v = split_heads(v, self.num_kv_heads)
            if inputs.positional is not None:
                q = inputs.positional.rotate(q, inputs.q_positions)
                k = inputs.positional.rotate(k, inputs.q_positions)  # new keys sit at the queries
            if cache is not None:
                k = torch.cat([cache.key, k], dim=2)
                v = torch.cat([cache.value, v], dim=2)
                cache.key, cache.value = k, v
        groups = self.num_heads // self.num_kv_heads
        k, v = repeat_kv_heads(k, groups), repeat_kv_heads(v, groups)
        if inputs.weights is not None and inputs.weights.wants(self):
            inputs.weights.record(self, self.probabilities(q, k, inputs))
        if inputs.bias is None:
            out = self.kernel(q, k, v, mask=inputs.mask)
        else:
            out = self.kernel(q, k, v, mask=inputs.mask, bias=inputs.bias)
        batch, _, q_len, _ = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(batch, q_len, -1))

    def probabilities(self, q: Tensor, k: Tensor, inputs: AttentionInputs) -> Tensor:
        """The attention probabilities of q (batch, heads, q_len, head_dim) over k (batch,
        heads, k_len, head_dim): softmax of the kernel's scaled (and soft-capped) scores under
        the mask and bias, (batch, heads, q_len, k_len) float32, whatever the kernel computes
        them with."""
        kernel = self.kernel
        scale = kernel.scale if getattr(kernel, "scale", None) is not None else self.head_dim ** -0.5
        scores = (q.float() @ k.float().transpose(-1, -2)) * scale
        softcap = getattr(kernel, "softcap", None)
        if softcap is not None:
            scores = softcap * torch.tanh(scores / softcap)
        return masked_softmax(scores, inputs.mask, inputs.bias)
