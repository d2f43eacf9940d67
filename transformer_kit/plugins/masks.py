"""Self-attention masks from positions (True = may attend): causal, sliding window, none; each
with its ONNX lowering."""

from __future__ import annotations

from torch import Tensor

from transformer_kit.core.graph_writer import GraphWriter
from transformer_kit.core.interfaces import AttentionMask
from transformer_kit.core.masks import NoMask

__all__ = ["CausalMask", "NoMask", "SlidingWindowMask", "causal_onnx", "no_mask_onnx",
           "sliding_window_onnx"]


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


# -- ONNX ------------------------------------------------------------------------------------------
def causal_onnx(g: GraphWriter, mask: CausalMask, q_positions, k_positions):
    """(batch, 1, q_len, k_len) bool: k_pos <= q_pos."""
    return g.op.LessOrEqual(g.op.Unsqueeze(k_positions, [1, 2]), g.op.Unsqueeze(q_positions, [1, 3]))


def sliding_window_onnx(g: GraphWriter, mask: SlidingWindowMask, q_positions, k_positions):
    """(batch, 1, q_len, k_len) bool: 0 <= q_pos - k_pos < window."""
    distance = g.op.Sub(g.op.Unsqueeze(q_positions, [1, 3]), g.op.Unsqueeze(k_positions, [1, 2]))
    return g.op.And(g.op.GreaterOrEqual(distance, [0]), g.op.Less(distance, [mask.window]))


def no_mask_onnx(g: GraphWriter, mask: AttentionMask, q_positions, k_positions):
    """No restriction besides padding."""
    return None
