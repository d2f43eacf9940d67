"""Normalisation layers: LayerNorm (the paper) and RMSNorm (Gemma's with (1 + weight)), and
RMSNorm of the queries and keys (``qk_norm`` components: per head as Qwen3, over the whole
projection as OLMo2); with their ONNX lowerings."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


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
def layer_norm_onnx(g, norm: nn.LayerNorm, x):
    """LayerNorm over the last axis: one ``LayerNormalization`` op (statistics in float32)."""
    scale = (g.weight(norm, "weight") if norm.weight is not None
             else g.constant(torch.ones(norm.normalized_shape[-1]).numpy(), g.float_type))
    bias = g.weight(norm, "bias") if norm.bias is not None else None
    return g.op.LayerNormalization(x, scale, bias, epsilon=norm.eps, axis=-1)


def rms_norm_onnx(g, norm: nn.RMSNorm, x):
    """RMSNorm over the last axis: one ``RMSNormalization`` op from opset 23 (float32 statistics;
    Gemma's (1 + weight), in float32 as Gemma computes it), its formula before."""
    eps = norm.eps if norm.eps is not None else float(torch.finfo(torch.float16 if g.float_type == g.FLOAT16
                                                                  else torch.float32).eps)
    offset = isinstance(norm, UnitOffsetRMSNorm)
    half = g.float_type != g.FLOAT
    scale = g.weight(norm, "weight", g.FLOAT if offset else None)
    if offset:
        scale = g.op.Add(scale, g.constant(1.0, g.FLOAT))
        if half:
            x = g.op.Cast(x, to=g.FLOAT)
    if g.opset >= 23:
        y = g.op.RMSNormalization(x, scale, epsilon=eps, axis=-1)
    else:
        wide = g.op.Cast(x, to=g.FLOAT) if half and not offset else x
        mean = g.op.ReduceMean(g.op.Mul(wide, wide), [-1], keepdims=1)
        y = g.op.Div(wide, g.op.Sqrt(g.op.Add(mean, g.constant(eps, g.FLOAT))))
        y = g.op.Mul(y if not half or offset else g.op.Cast(y, to=g.float_type), scale)
    return g.op.Cast(y, to=g.float_type) if offset and half else y


def qk_norm_onnx(g, norm: QKNorm, q, k):
    """q (batch, len, num_heads * head_dim), k (batch, len, num_kv_heads * head_dim), each
    normalised per head (Qwen3) or over the whole projection (OLMo2)."""

    def one(inner: nn.RMSNorm, x):
        if norm.head_dim is None:
            return g.call(inner, x)
        heads = g.op.Reshape(x, [0, 0, -1, norm.head_dim])
        return g.op.Reshape(g.call(inner, heads), [0, 0, -1])

    return one(norm.q_norm, q), one(norm.k_norm, k)
