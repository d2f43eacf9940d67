"""Head layout helpers shared by the attention module and its export-time custom ops."""

from __future__ import annotations

from torch import Tensor


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
