"""Cosine-similarity attention for transformer_kit, registered through the entry point
``transformer_kit`` (see this package's pyproject.toml).

Two components, to show both ways a component reaches ONNX:

- ``attention: cosine`` brings its own lowering (``tk.Lowering``, registered with its
  component): the export writes its nodes from :func:`cosine_attention_onnx` in milliseconds.
- ``qk_norm: l2_heads`` brings none: the export traces its module alone, once, and inlines the
  traced nodes in every layer (the export's report names it).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

import transformer_kit as tk
from transformer_kit.core.interfaces import AttentionKernel
from transformer_kit.core.masks import masked_softmax

__all__ = ["CosineAttention", "L2HeadNorm", "cosine_attention_onnx", "transformer_kit_components"]


class CosineAttention(AttentionKernel):
    """softmax(temperature * cos(q, k) + bias) v over the keys the mask allows.

    q (batch, heads, q_len, head_dim), k and v (batch, heads, k_len, head_dim); a row with no
    visible key gives zeros. The temperature is a learned scalar, initialised to ``temperature``.
    """

    def __init__(self, temperature: float = 10.0) -> None:
        super().__init__()
        if not temperature > 0:
            raise ValueError(f"temperature must be positive, got {temperature!r}")
        self.temperature = torch.nn.Parameter(torch.tensor(float(temperature)))

    def weights(self, q: Tensor, k: Tensor, mask: Tensor | None = None,
                bias: Tensor | None = None) -> Tensor:
        """Attention weights (batch, heads, q_len, k_len), float32."""
        q, k = F.normalize(q.float(), dim=-1), F.normalize(k.float(), dim=-1)
        return masked_softmax(self.temperature * (q @ k.transpose(-2, -1)), mask, bias)

    def forward(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
                bias: Tensor | None = None) -> Tensor:
        return (self.weights(q, k, mask, bias) @ v.float()).to(v.dtype)


def cosine_attention_onnx(g: tk.GraphWriter, kernel: CosineAttention, q, k, v, mask=None, bias=None):
    """The kernel as ONNX nodes, op for op as ``forward`` computes it (in float32): q, k, v
    (batch, heads, len, head_dim) graph values, mask (batch, 1, q_len | 1, k_len) bool,
    bias (batch, heads, q_len, k_len) -> (batch, heads, q_len, head_dim)."""
    q, k, v = (g.op.Cast(t, to=g.FLOAT) for t in (q, k, v))

    def normalize(x):  # F.normalize: x / max(|x|, 1e-12)
        return g.op.Div(x, g.op.Max(g.op.ReduceL2(x, [-1], keepdims=1), g.constant(1e-12, g.FLOAT)))

    cosines = g.op.MatMul(normalize(q), g.op.Transpose(normalize(k), perm=[0, 1, 3, 2]))
    scores = g.op.Mul(g.weight(kernel, "temperature", g.FLOAT), cosines)
    if bias is not None:
        scores = g.op.Add(scores, g.op.Cast(bias, to=g.FLOAT))
    if mask is not None:  # masked_softmax: masked keys get nothing, a row without keys zeros
        scores = g.op.Where(mask, scores, g.constant(torch.finfo(torch.float32).min, g.FLOAT))
    weights = g.op.Softmax(scores, axis=-1)
    if mask is not None:
        weights = g.op.Where(mask, weights, g.constant(0.0, g.FLOAT))
    return g.op.Cast(g.op.MatMul(weights, v), to=g.float_type)


class L2HeadNorm(torch.nn.Module):
    """Each query and key head scaled to unit length, times a learned gain (query-key
    normalisation): q (batch, len, num_heads * head_dim), k (batch, len, num_kv_heads *
    head_dim) -> both in those shapes."""

    def __init__(self, head_dim: int) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.gain = torch.nn.Parameter(torch.tensor(math.sqrt(head_dim)))

    def _norm(self, x: Tensor) -> Tensor:
        heads = x.unflatten(-1, (-1, self.head_dim))
        return (F.normalize(heads, dim=-1) * self.gain).flatten(-2)

    def forward(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        return self._norm(q), self._norm(k)


@tk.hookimpl
def transformer_kit_components() -> list[tk.Component]:
    return [
        tk.Component("attention", "cosine", CosineAttention, provides={"score_bias"},
                     lowering=tk.Lowering(forward=cosine_attention_onnx),
                     description="cosine-similarity attention with a learned temperature"),
        tk.Component("qk_norm", "l2_heads", L2HeadNorm,
                     description="each query and key head at unit length, times a learned gain"),
    ]
