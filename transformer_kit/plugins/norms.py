"""Normalisation layers: LayerNorm (the paper) and RMSNorm (Gemma's with (1 + weight)), and
RMSNorm of the queries and keys (``qk_norm`` components: per head as Qwen3, over the whole
projection as OLMo2); with their ONNX lowerings."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from transformer_kit.core import layer_lowerings
from transformer_kit.core.graph_writer import GraphWriter


def _check_eps(eps: float) -> None:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
        raise ValueError(f"eps must be a positive number, got {eps!r}")


def layer_norm(d_model: int, eps: float = 1e-5, bias: bool = True) -> nn.LayerNorm:
    _check_eps(eps)
    return nn.LayerNorm(d_model, eps=eps, bias=bias)


class UnitOffsetRMSNorm(nn.RMSNorm):
    """RMSNorm scaling by (1 + weight), the weight starting at zero (Gemma's): x (..., d_model)
    -> same, computed in float32 and returned in x's dtype, as Gemma computes it."""

    def __init__(self, d_model: int, eps: float) -> None:
        super().__init__(d_model, eps=eps)
        nn.init.zeros_(self.weight)

    def reset_parameters(self) -> None:
        if getattr(self, "weight", None) is not None:
            nn.init.zeros_(self.weight)

    def forward(self, x: Tensor) -> Tensor:
        scale = 1.0 + self.weight.float()
        return F.rms_norm(x.float(), self.normalized_shape, scale, self.eps).to(x.dtype)


def rms_norm(d_model: int, eps: float = 1e-6, unit_offset: bool = False) -> nn.RMSNorm:
    """RMSNorm; ``unit_offset``: scale by (1 + weight) (Gemma's; the weight starts at zero)."""
    _check_eps(eps)
    if not isinstance(unit_offset, bool):
        raise ValueError(f"unit_offset must be true or false, got {unit_offset!r}")
    return UnitOffsetRMSNorm(d_model, eps) if unit_offset else nn.RMSNorm(d_model, eps=eps)


class QKNorm(nn.Module):
    """RMSNorm of the self-attention queries and keys, after their projections and before
    rotary: ``forward(q, k)`` with q (batch, len, num_heads * head_dim) and k (batch, len,
    num_kv_heads * head_dim) returns both normalised, in the same shapes.

    ``head_dim`` given: each head's features are normalised on their own, with weights
    ``q_norm.weight``, ``k_norm.weight`` (head_dim,) shared by the heads (Qwen3, Gemma 3);
    None: each projection's whole output is, with weights of its width (OLMo2).
    ``unit_offset``: scale by (1 + weight), as Gemma 3's.
    """

    def __init__(self, q_width: int, k_width: int, eps: float, head_dim: int | None = None,
                 unit_offset: bool = False) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.q_norm = rms_norm(head_dim or q_width, eps, unit_offset)
        self.k_norm = rms_norm(head_dim or k_width, eps, unit_offset)

    def _norm(self, norm: nn.RMSNorm, x: Tensor) -> Tensor:
        if self.head_dim is None:
            return norm(x)
        return norm(x.unflatten(-1, (-1, self.head_dim))).flatten(-2)

    def forward(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        return self._norm(self.q_norm, q), self._norm(self.k_norm, k)


def per_head_rms_norm(head_dim: int, eps: float = 1e-6, unit_offset: bool = False) -> QKNorm:
    return QKNorm(head_dim, head_dim, eps, head_dim=head_dim, unit_offset=unit_offset)


def projection_rms_norm(head_dim: int, num_heads: int, num_kv_heads: int,
                        eps: float = 1e-6) -> QKNorm:
    return QKNorm(num_heads * head_dim, num_kv_heads * head_dim, eps)


# -- ONNX ------------------------------------------------------------------------------------------
def rms_norm_onnx(g: GraphWriter, norm: nn.RMSNorm, x):
    """RMSNorm over the last axis (Gemma's (1 + weight) for a :class:`UnitOffsetRMSNorm`)."""
    return layer_lowerings.rms_norm_onnx(g, norm, x, unit_offset=isinstance(norm, UnitOffsetRMSNorm))


def qk_norm_onnx(g: GraphWriter, norm: QKNorm, q, k):
    """q (batch, len, num_heads * head_dim), k (batch, len, num_kv_heads * head_dim), each
    normalised per head (Qwen3) or over the whole projection (OLMo2)."""

    def one(inner: nn.RMSNorm, x):
        if norm.head_dim is None:
            return rms_norm_onnx(g, inner, x)
        heads = g.op.Reshape(x, [0, 0, -1, norm.head_dim])
        return g.op.Reshape(rms_norm_onnx(g, inner, heads), [0, 0, -1])

    return one(norm.q_norm, q), one(norm.k_norm, k)
