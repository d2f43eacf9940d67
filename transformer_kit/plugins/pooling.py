"""Pooling: the last hidden states of an encoder (batch, len, d_model) -> one sentence vector
(batch, d_model), as sentence-transformers' ``Pooling`` modes compute it.

Every module takes ``keep`` (batch, len) bool: True for the positions pooled (real tokens, less
the prompt when the sentence embedding excludes it). Sums run in float32 whatever the hidden
states' dtype, and a row with no kept position gives zeros (never NaN or -inf).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


def _weights(keep: Tensor, like: Tensor) -> Tensor:
    """keep (batch, len) bool -> (batch, len, 1) float32 (1 where kept)."""
    return keep[..., None].to(torch.float32 if like.dtype != torch.float64 else like.dtype)


class ClsPooling(nn.Module):
    """The first kept position of each row (BERT's [CLS] with right padding)."""

    def forward(self, hidden: Tensor, keep: Tensor) -> Tensor:
        # argmax over float32: onnxruntime's CUDA ArgMax takes floating types only
        first = keep.to(torch.float32).argmax(dim=1)  # (batch,) 0 for a row with nothing kept
        index = first[:, None, None].expand(-1, 1, hidden.shape[-1])
        return torch.gather(hidden, 1, index.to(torch.int64)).squeeze(1)


class LastTokenPooling(nn.Module):
    """The last kept position of each row (decoder-style embedding models)."""

    def forward(self, hidden: Tensor, keep: Tensor) -> Tensor:
        length = keep.shape[1]
        flipped = keep.to(torch.float32).flip(1)  # float32: CUDA's ArgMax and ReduceMax take it
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

    def forward(self, hidden: Tensor, keep: Tensor) -> Tensor:
        weights = _weights(keep, hidden)
        total = (hidden * weights.to(hidden.dtype)).sum(dim=1, dtype=weights.dtype)  # (batch, d)
        count = weights.sum(dim=1).clamp(min=1e-9)  # (batch, 1)
        return (total / (count.sqrt() if self.sqrt_len else count)).to(hidden.dtype)


class WeightedMeanPooling(nn.Module):
    """The mean over kept positions weighted by position (1 for the first real token): later
    tokens weigh more (SGPT's weighted mean)."""

    def forward(self, hidden: Tensor, keep: Tensor) -> Tensor:
        weights = _weights(keep, hidden)
        position = torch.arange(1, hidden.shape[1] + 1, device=hidden.device, dtype=weights.dtype)
        weighted = weights * position[None, :, None]  # (batch, len, 1)
        total = (hidden * weighted).sum(dim=1)
        return (total / weighted.sum(dim=1).clamp(min=1e-9)).to(hidden.dtype)


class MaxPooling(nn.Module):
    """The feature-wise maximum over kept positions (zeros for a row with none)."""

    def forward(self, hidden: Tensor, keep: Tensor) -> Tensor:
        lowest = torch.finfo(hidden.dtype).min
        best = hidden.masked_fill(~keep[..., None], lowest).amax(dim=1)
        return best * keep.any(dim=1, keepdim=True).to(hidden.dtype)


def mean_sqrt_len_pooling() -> MeanPooling:
    return MeanPooling(sqrt_len=True)
