"""Pooling: the last hidden states of an encoder (batch, len, d_model) -> one sentence vector
(batch, d_model), as sentence-transformers' ``Pooling`` modes compute it.

Every module takes ``real`` (batch, len) bool: True for the positions pooled (real tokens, less
the prompt when the sentence embedding excludes it). Sums run in float32 whatever the hidden
states' dtype, and a row with no kept position gives zeros (never NaN or -inf). Each pooling's
ONNX lowering follows it at the end of the module.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from transformer_kit.core.graph_writer import GraphWriter


def _weights(real: Tensor, like: Tensor) -> Tensor:
    """real (batch, len) bool -> (batch, len, 1) float32 (1 where kept)."""
    return real[..., None].to(torch.float32 if like.dtype != torch.float64 else like.dtype)


class ClsPooling(nn.Module):
    """The first kept position of each row (BERT's [CLS] with right padding)."""

    def forward(self, hidden: Tensor, real: Tensor) -> Tensor:
        # argmax over float32: onnxruntime's CUDA ArgMax takes floating types only
        first = real.to(torch.float32).argmax(dim=1)  # (batch,) 0 for a row with nothing kept
        index = first[:, None, None].expand(-1, 1, hidden.shape[-1])
        return torch.gather(hidden, 1, index.to(torch.int64)).squeeze(1)


class LastTokenPooling(nn.Module):
    """The last kept position of each row (decoder-style embedding models)."""

    def forward(self, hidden: Tensor, real: Tensor) -> Tensor:
        length = real.shape[1]
        flipped = real.to(torch.float32).flip(1)  # float32: CUDA's ArgMax and ReduceMax take it
        found, last_from_end = flipped.max(dim=1)
        last = torch.where(found == 0, length - 1, length - 1 - last_from_end)
        index = last[:, None, None].expand(-1, 1, hidden.shape[-1])
        picked = torch.gather(hidden, 1, index.to(torch.int64)).squeeze(1)
        return picked * (found > 0)[:, None].to(picked.dtype)


class MeanPooling(nn.Module):
    """The mean over kept positions; ``sqrt_len``: the sum over sqrt(count) instead
    (``mean_sqrt_len_tokens``)."""

    def __init__(self, sqrt_len: bool = False) -> None:
        super().__init__()
        self.sqrt_len = sqrt_len

    def forward(self, hidden: Tensor, real: Tensor) -> Tensor:
        weights = _weights(real, hidden)
        total = (hidden * weights.to(hidden.dtype)).sum(dim=1, dtype=weights.dtype)  # (batch, d)
        count = weights.sum(dim=1).clamp(min=1e-9)  # (batch, 1)
        return (total / (count.sqrt() if self.sqrt_len else count)).to(hidden.dtype)


class WeightedMeanPooling(nn.Module):
    """The mean over kept positions weighted by position (1 for the first real token): later
    tokens weigh more (SGPT's weighted mean)."""

    def forward(self, hidden: Tensor, real: Tensor) -> Tensor:
        weights = _weights(real, hidden)
        position = torch.arange(1, hidden.shape[1] + 1, device=hidden.device, dtype=weights.dtype)
        weighted = weights * position[None, :, None]  # (batch, len, 1)
        total = (hidden * weighted).sum(dim=1)
        return (total / weighted.sum(dim=1).clamp(min=1e-9)).to(hidden.dtype)


class MaxPooling(nn.Module):
    """The feature-wise maximum over kept positions (zeros for a row with none)."""

    def forward(self, hidden: Tensor, real: Tensor) -> Tensor:
        lowest = torch.finfo(hidden.dtype).min
        best = hidden.masked_fill(~real[..., None], lowest).amax(dim=1)
        return best * real.any(dim=1, keepdim=True).to(hidden.dtype)


def mean_sqrt_len_pooling() -> MeanPooling:
    return MeanPooling(sqrt_len=True)


# -- ONNX: hidden (batch, len, d_model), keep (batch, len) bool -> (batch, d_model) ---------------
def _kept_weights(g: GraphWriter, real):
    """(batch, len, 1) float32, 1 where kept."""
    return g.op.Unsqueeze(g.op.Cast(real, to=g.FLOAT), [-1])


def _pick(g: GraphWriter, hidden, index):
    """Row b's hidden state at position index[b] (batch,) int64 -> (batch, d_model)."""
    width = g.op.Shape(hidden, start=2, end=3)
    index = g.op.Expand(g.op.Unsqueeze(index, [1, 2]), g.op.Concat([1, 1], width, axis=0))
    return g.op.Squeeze(g.op.GatherElements(hidden, index, axis=1), [1])


def cls_onnx(g: GraphWriter, pooling: ClsPooling, hidden, real):
    first = g.op.ArgMax(g.op.Cast(real, to=g.FLOAT), axis=1, keepdims=0)
    return _pick(g, hidden, first)


def last_token_onnx(g: GraphWriter, pooling: LastTokenPooling, hidden, real):
    flipped = g.op.Slice(g.op.Cast(real, to=g.FLOAT), [-1], [-(2**62)], [1], [-1])
    found = g.op.ReduceMax(flipped, [1], keepdims=0)
    last = g.op.Sub(g.op.Sub(g.op.Shape(real, start=1, end=2), [1]),
                    g.op.ArgMax(flipped, axis=1, keepdims=0))
    last = g.op.Where(g.op.Equal(found, g.constant(0.0, g.FLOAT)),
                      g.op.Sub(g.op.Shape(real, start=1, end=2), [1]), last)
    picked = _pick(g, hidden, last)
    return g.op.Mul(picked, g.op.Unsqueeze(g.op.Cast(g.op.Greater(found, g.constant(0.0, g.FLOAT)),
                                                     to=g.float_type), [1]))


def mean_onnx(g: GraphWriter, pooling: MeanPooling, hidden, real):
    weights = _kept_weights(g, real)
    product = g.op.Mul(hidden, g.op.Cast(weights, to=g.float_type))
    total = g.op.ReduceSum(g.op.Cast(product, to=g.FLOAT), [1], keepdims=0)
    count = g.op.Max(g.op.ReduceSum(weights, [1], keepdims=0), g.constant(1e-9, g.FLOAT))
    mean = g.op.Div(total, g.op.Sqrt(count) if pooling.sqrt_len else count)
    return mean if g.float_type == g.FLOAT else g.op.Cast(mean, to=g.float_type)


def weighted_mean_onnx(g: GraphWriter, pooling: WeightedMeanPooling, hidden, real):
    weights = _kept_weights(g, real)
    length = g.op.Cast(g.op.Squeeze(g.op.Shape(real, start=1, end=2), [0]), to=g.FLOAT)
    position = g.op.Range(g.constant(1.0, g.FLOAT), g.op.Add(length, g.constant(1.0, g.FLOAT)),
                          g.constant(1.0, g.FLOAT))
    weighted = g.op.Mul(weights, g.op.Unsqueeze(position, [0, 2]))
    wide = hidden if g.float_type == g.FLOAT else g.op.Cast(hidden, to=g.FLOAT)
    total = g.op.ReduceSum(g.op.Mul(wide, weighted), [1], keepdims=0)
    mean = g.op.Div(total, g.op.Max(g.op.ReduceSum(weighted, [1], keepdims=0),
                                    g.constant(1e-9, g.FLOAT)))
    return mean if g.float_type == g.FLOAT else g.op.Cast(mean, to=g.float_type)


def max_onnx(g: GraphWriter, pooling: MaxPooling, hidden, real):
    lowest = float(torch.finfo(torch.float16 if g.float_type == g.FLOAT16 else torch.float32).min)
    best = g.op.ReduceMax(g.op.Where(g.op.Unsqueeze(real, [-1]), hidden, g.constant(lowest)), [1],
                          keepdims=0)
    any_kept = g.op.ReduceMax(g.op.Cast(real, to=g.FLOAT), [1], keepdims=1)
    return g.op.Mul(best, g.op.Cast(any_kept, to=g.float_type))
