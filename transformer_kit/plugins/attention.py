"""Attention kernels: matrix products (the paper's formula), einsum, PyTorch's fused SDPA.

All three compute softmax(q k^T / sqrt(head_dim) + bias) v over the keys a boolean mask allows
(True = may attend) and return zeros for a query with no visible key. ``scale`` replaces
1/sqrt(head_dim) (Gemma's ``query_pre_attn_scalar`` ** -0.5, Granite's attention multiplier);
``softcap`` c bounds each score as c * tanh(score / c) before the mask (Gemma 2). float16/bfloat16 inputs
are computed in float32 and rounded once at the end by the reference kernels, and by ``sdpa``
on the CPU (which has no fast half-precision attention); ``sdpa`` runs natively elsewhere.
``sinks: true`` gives the kernel one learned logit per query head (the parameter ``sinks``,
(num_heads,)) that joins each softmax's denominator as a key without a value (gpt-oss's
attention sinks): softmax over [scores, sink], the sink's weight dropped.
:func:`attention_onnx` writes the formula as ONNX nodes for all three (where ``sdpa`` can, the
export puts one ONNX ``Attention`` op in its place instead: its ``attention`` lowering).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_kit.core.graph_writer import GraphWriter
from transformer_kit.core.interfaces import AttentionKernel
from transformer_kit.core.masks import check_mask, masked_softmax

_HALF = (torch.float16, torch.bfloat16)


def _upcast(*tensors: Tensor) -> list[Tensor]:
    return [t.float() if t.dtype in _HALF else t for t in tensors]


class _ScaledKernel(AttentionKernel):
    def __init__(self, scale: float | None = None, softcap: float | None = None,
                 sinks: bool = False, num_heads: int | None = None) -> None:
        super().__init__()
        for name, value in (("scale", scale), ("softcap", softcap)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not value > 0 or not math.isfinite(value)):
                raise ValueError(f"{name} must be a positive number or null, got {value!r}")
        if not isinstance(sinks, bool):
            raise ValueError(f"sinks must be true or false (a learned sink logit per head), got {sinks!r}")
        if sinks and (isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1):
            raise ValueError(f"sinks need the model's num_heads (one sink per query head), got {num_heads!r}")
        self.scale = None if scale is None else float(scale)
        self.softcap = None if softcap is None else float(softcap)
        # (num_heads,): each head's sink logit, read from a checkpoint (zeros until then)
        self.sinks = nn.Parameter(torch.zeros(num_heads)) if sinks else None

    def sink_logits(self) -> Tensor | None:
        return self.sinks

    def _scale_for(self, q: Tensor) -> float:
        return self.scale if self.scale is not None else 1.0 / math.sqrt(q.shape[-1])

    def _capped(self, scores: Tensor) -> Tensor:
        """Scores (..., q_len, k_len) bounded to (-softcap, softcap) by tanh, when configured."""
        return scores if self.softcap is None else torch.tanh(scores / self.softcap) * self.softcap


class MatmulAttention(_ScaledKernel):
    """Attention by matrix products: ``softmax(matmul(q, k^T) / sqrt(d_k)) v``."""

    def weights(self, q: Tensor, k: Tensor, mask: Tensor | None = None,
                bias: Tensor | None = None) -> Tensor:
        """Attention weights (batch, heads, q_len, k_len), in float32 for half inputs."""
        q, k = _upcast(q, k)
        scores = self._capped(torch.matmul(q, k.transpose(-2, -1)) * self._scale_for(q))
        return masked_softmax(scores, mask, bias, self.sinks)

    def forward(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
                bias: Tensor | None = None) -> Tensor:
        weights = self.weights(q, k, mask, bias)
        return torch.matmul(weights, _upcast(v)[0]).to(v.dtype)


class EinsumAttention(_ScaledKernel):
    """Attention by einsum (``nqhd,nkhd->nhqk``), on the (batch, len, heads, dim) layout."""

    def forward(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
                bias: Tensor | None = None) -> Tensor:
        scale = self._scale_for(q)
        queries, keys, values = (t.transpose(1, 2) for t in _upcast(q, k, v))  # (n, len, h, d)
        energy = self._capped(torch.einsum("nqhd,nkhd->nhqk", queries, keys) * scale)
        weights = masked_softmax(energy, mask, bias, self.sinks)
        out = torch.einsum("nhql,nlhd->nqhd", weights, values)
        return out.transpose(1, 2).to(v.dtype)


class SdpaAttention(_ScaledKernel):
    """PyTorch's fused ``scaled_dot_product_attention``; exports to ONNX ``Attention``. With a
    ``softcap`` or ``sinks`` (which PyTorch's fused kernel and ONNX's ``Attention`` lack) it
    computes, and exports, as ``matmul`` does."""

    def forward(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
                bias: Tensor | None = None) -> Tensor:
        if self.softcap is not None or self.sinks is not None:
            weights = MatmulAttention.weights(self, q, k, mask, bias)  # type: ignore[arg-type]
            return torch.matmul(weights, _upcast(v)[0]).to(v.dtype)
        if q.device.type == "cpu" and q.dtype in _HALF:
            return self._attend(*_upcast(q, k, v), mask, bias).to(v.dtype)
        return self._attend(q, k, v, mask, bias)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None,
                bias: Tensor | None) -> Tensor:
        if mask is None:
            attn_mask = None if bias is None else bias.to(q.dtype)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=self.scale)
        check_mask(mask, (*q.shape[:-1], k.shape[-2]))
        has_key = mask.any(dim=-1, keepdim=True)
        visible = mask | ~has_key  # a row with no visible key attends to all, then gets zeroed
        if bias is None:
            attn_mask = visible
        else:
            attn_mask = bias.to(q.dtype).masked_fill(~visible, torch.finfo(q.dtype).min)
        if attn_mask.shape[-2] != q.shape[-2]:  # ONNX Attention does not broadcast the query axis
            attn_mask = attn_mask.expand(*attn_mask.shape[:-2], q.shape[-2], attn_mask.shape[-1])
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=self.scale)
        return out.masked_fill(~has_key, 0.0)


# -- ONNX ------------------------------------------------------------------------------------------
def attention_onnx(g: GraphWriter, kernel: _ScaledKernel, q, k, v, mask=None, bias=None):
    """The lowering of the three kernels (one formula): q (batch, heads, q_len, dim), k and v
    (batch, heads, k_len, dim), mask (batch, 1, q_len | 1, k_len) bool (True = may attend),
    bias (batch, heads, q_len, k_len) -> (batch, heads, q_len, dim). Scores, softmax and the
    weighted sum in float32 whatever the activations' type, as the kernels compute them; a row
    with no visible key gives zeros. Sinks: a (batch, heads, q_len, 1) column of each head's
    sink concatenated to the scores, the softmax, the column sliced off."""
    half = g.float_type != g.FLOAT
    if half:
        q, k, v = (g.op.Cast(t, to=g.FLOAT) for t in (q, k, v))
    dim = q.shape[-1] if q.shape is not None and isinstance(q.shape[-1], int) else g.config.attention_head_dim
    scale = kernel.scale if kernel.scale is not None else 1.0 / math.sqrt(dim)
    scores = g.op.Mul(g.op.MatMul(q, g.op.Transpose(k, perm=[0, 1, 3, 2])), g.constant(scale, g.FLOAT))
    if kernel.softcap is not None:
        cap = g.constant(kernel.softcap, g.FLOAT)
        scores = g.op.Mul(g.op.Tanh(g.op.Div(scores, cap)), cap)
    if bias is not None:
        scores = g.op.Add(scores, bias if bias.dtype == g.FLOAT else g.op.Cast(bias, to=g.FLOAT))
    if mask is not None:
        scores = g.op.Where(mask, scores, g.constant(torch.finfo(torch.float32).min, g.FLOAT))
    if kernel.sinks is None:
        weights = g.op.Softmax(scores, axis=-1)
    else:  # a column of each head's sink logit joins the softmax, then is dropped
        sinks = g.op.Reshape(g.weight(kernel, "sinks", g.FLOAT), [1, -1, 1, 1])  # (1, heads, 1, 1)
        rows = g.op.Concat(g.op.Shape(scores, start=0, end=3), [1], axis=0)  # (batch, heads, q_len, 1)
        joined = g.op.Concat(scores, g.op.Expand(sinks, rows), axis=-1)
        weights = g.op.Slice(g.op.Softmax(joined, axis=-1), [0], [-1], [-1])
    if mask is not None:
        weights = g.op.Where(mask, weights, g.constant(0.0, g.FLOAT))
    out = g.op.MatMul(weights, v)
    return g.op.Cast(out, to=g.float_type) if half else out
