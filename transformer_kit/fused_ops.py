"""Attention as one custom op while a model is exported, so the ONNX graph holds one
``Attention`` node per layer on (batch, len, heads * head_dim) tensors, with the key/value
cache concatenated inside it (ONNX opset 23), instead of reshapes, transposes and concats.

Eager PyTorch never calls these ops: :class:`~transformer_kit.attention.MultiHeadAttention`
uses them only while tracing inside :func:`packed_attention_export`, and the export is verified
against the eager model, so the two paths are checked against each other.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor

from transformer_kit.heads import repeat_kv_heads, split_heads

_state = {"enabled": False}


@contextlib.contextmanager
def packed_attention_export(enabled: bool = True) -> Iterator[None]:
    """While active (and tracing), attention with the ``sdpa`` kernel exports as one op."""
    previous = _state["enabled"]
    _state["enabled"] = enabled
    try:
        yield
    finally:
        _state["enabled"] = previous


def packed_attention_enabled() -> bool:
    return _state["enabled"]


def _attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, num_heads: int,
            scale: float) -> Tensor:
    """q (batch, heads, q_len, dim), k, v (batch, kv_heads, k_len, dim) -> (batch, q_len, width)."""
    groups = num_heads // k.shape[1]
    k, v = repeat_kv_heads(k, groups), repeat_kv_heads(v, groups)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    return out.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)


@torch.library.custom_op("transformer_kit::packed_attention", mutates_args=())
def packed_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, num_heads: int,
                     kv_heads: int, scale: float) -> Tensor:
    """q (batch, q_len, num_heads * dim), k, v (batch, k_len, kv_heads * dim), mask (batch, 1,
    q_len, k_len) bool (True = may attend; every row has a visible key) -> (batch, q_len, width)."""
    return _attend(split_heads(q, num_heads), split_heads(k, kv_heads), split_heads(v, kv_heads),
                   mask, num_heads, scale)


@packed_attention.register_fake
def _(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, num_heads: int, kv_heads: int,
      scale: float) -> Tensor:
    return torch.empty_like(q)


@torch.library.custom_op("transformer_kit::packed_cached_attention", mutates_args=())
def packed_cached_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None,
                            past_key: Tensor, past_value: Tensor, num_heads: int, kv_heads: int,
                            scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """As :func:`packed_attention` after the cache: past_key, past_value (batch, kv_heads,
    past_len, dim); the mask covers past_len + q_len keys. Returns the output and the cache
    extended by the new keys and values (batch, kv_heads, past_len + q_len, dim)."""
    key = torch.cat([past_key, split_heads(k, kv_heads)], dim=2)
    value = torch.cat([past_value, split_heads(v, kv_heads)], dim=2)
    return _attend(split_heads(q, num_heads), key, value, mask, num_heads, scale), key, value


@packed_cached_attention.register_fake
def _(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, past_key: Tensor, past_value: Tensor,
      num_heads: int, kv_heads: int, scale: float) -> tuple[Tensor, Tensor, Tensor]:
    batch, new, _ = k.shape
    _, heads, past, dim = past_key.shape
    total = past + new
    return (torch.empty_like(q), past_key.new_empty(batch, heads, total, dim),
            past_value.new_empty(batch, heads, total, dim))
