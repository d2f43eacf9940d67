"""Self-attention masks from positions (True = may attend): causal, sliding window, none."""

from __future__ import annotations

from torch import Tensor

from transformer_kit.interfaces import AttentionMask
from transformer_kit.masks import NoMask

__all__ = ["CausalMask", "NoMask", "SlidingWindowMask"]


class CausalMask(AttentionMask):
    """Look-ahead mask: position i sees positions <= i (a lower-triangular ``torch.tril`` mask)."""

    def __call__(self, q_positions: Tensor, k_positions: Tensor) -> Tensor:
        return (k_positions[:, None, None, :] <= q_positions[:, None, :, None])


class SlidingWindowMask(AttentionMask):
    """Causal, and at most ``window`` positions back (the query's own included)."""

    def __init__(self, window: int) -> None:
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"window must be a positive integer, got {window!r}")
        self.window = window

    def __call__(self, q_positions: Tensor, k_positions: Tensor) -> Tensor:
        distance = q_positions[:, None, :, None] - k_positions[:, None, None, :]
        return (distance >= 0) & (distance < self.window)
