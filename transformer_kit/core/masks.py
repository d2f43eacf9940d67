"""Masks, one convention everywhere: boolean, True = may attend.

Padding comes from an ``attention_mask`` (1 = real token, as transformers) or else from token
ids and ``pad_id``; look-ahead and other self-attention masks are
components (kind ``mask``) computed from positions; all are combined by logical and. Masked
scores are filled with the dtype's most negative finite value, and a query row with no visible
key yields zeros, never NaN.
"""

from __future__ import annotations

import torch
from torch import Tensor

from transformer_kit.core.errors import InputError, MaskError
from transformer_kit.core.inputs import tracing
from transformer_kit.core.interfaces import AttentionMask


def padding_mask(ids: Tensor, pad_id: int | None) -> Tensor:
    """Key mask of a batch of token ids.

    Args:
        ids: (batch, len) integer token ids.
        pad_id: the padding id, or None when nothing is padding.
    Returns:
        (batch, 1, 1, len) bool, True where the key is a real token (may be attended).
        A 0/1 padding mask (1 = padding, as many tutorials write it) is its negation.
    """
    return real_mask(ids, pad_id)[:, None, None, :]


def real_mask(ids: Tensor, pad_id: int | None) -> Tensor:
    """(batch, len) bool, True where ``ids`` is a real token."""
    if pad_id is None:
        return torch.ones(ids.shape, dtype=torch.bool, device=ids.device)
    return ids != pad_id


def real_tokens(ids: Tensor, attention_mask: Tensor | None, pad_id: int | None) -> Tensor:
    """(batch, len) bool, True for real tokens: from ``attention_mask`` (batch, len), 1 (or
    True) = real token as transformers takes it, or else from ``pad_id``."""
    if attention_mask is None:
        return real_mask(ids, pad_id)
    if not isinstance(attention_mask, Tensor):
        raise InputError(f"attention_mask must be a torch.Tensor, got {type(attention_mask).__name__}.")
    if not tracing():
        if tuple(attention_mask.shape) != tuple(ids.shape):
            raise InputError(f"attention_mask has shape {tuple(attention_mask.shape)} but the ids "
                             f"have shape {tuple(ids.shape)}; give one 0/1 entry per token "
                             "(1 = real token).")
        if attention_mask.dtype != torch.bool and not bool(
                ((attention_mask == 0) | (attention_mask == 1)).all()):
            raise InputError("attention_mask must hold 0 and 1 only (1 = real token, 0 = padding).")
    return attention_mask if attention_mask.dtype == torch.bool else attention_mask != 0


def from_padding_convention(mask: Tensor) -> Tensor:
    """Convert a 0/1 mask where 1 marks padding to the kit's convention (True = may attend)."""
    return mask == 0


def from_keep_convention(mask: Tensor) -> Tensor:
    """Convert a 0/1 mask where 1 marks what may be attended (Hugging Face's attention_mask)
    to the kit's convention (True = may attend)."""
    return mask != 0


def positions_from_real(real: Tensor) -> Tensor:
    """Position of each token counting real tokens only.

    Args:
        real: (batch, len) bool, True for real tokens.
    Returns:
        (batch, len) int64; left padding does not shift the positions of real tokens, and a
        padding slot gets the position of the last real token before it (or 0).
    """
    return (real.long().cumsum(-1) - 1).clamp(min=0)


def check_mask(mask: Tensor, scores_shape: tuple[int, ...] | None = None) -> None:
    """Refuse a mask that is not boolean (batch|1, heads|1, q_len|1, k_len), saying how to fix it."""
    if scores_shape is not None and not tracing() and (
        mask.dim() != 4
        or any(m not in (1, s) for m, s in zip(mask.shape, scores_shape, strict=True))
    ):
        raise MaskError(
            f"Attention mask of shape {tuple(mask.shape)} does not broadcast to the scores "
            f"{tuple(scores_shape)}; give 4 axes (batch|1, heads|1, q_len|1, k_len), e.g. "
            "mask[:, None, None, :] for a (batch, k_len) key mask."
        )
    if mask.dtype != torch.bool:
        raise MaskError(
            f"Attention masks are boolean with True = may attend; got dtype {mask.dtype}. "
            "Convert a 0/1 mask with transformer_kit.core.masks.from_keep_convention (1 = may attend, "
            "as Hugging Face's attention_mask) or from_padding_convention (1 = padding)."
        )


def masked_softmax(scores: Tensor, mask: Tensor | None = None, bias: Tensor | None = None,
                   sinks: Tensor | None = None) -> Tensor:
    """Softmax over the key axis with an optional additive bias, boolean mask and sinks.

    Args:
        scores: (batch, heads, q_len, k_len) scaled dot products, float32 or float64.
        mask: broadcastable to scores, bool, True = may attend.
        bias: broadcastable to scores, added before masking (e.g. ALiBi).
        sinks: (heads,) logits of one more, value-less key per head that every query sees
            (gpt-oss's attention sinks): they join each row's denominator, and their weight
            is dropped.
    Returns:
        weights of the same shape; masked keys get exactly 0 and a row with no visible key
        is all zeros.
    """
    if bias is not None:
        scores = scores + bias.to(scores.dtype)
    if mask is not None:
        check_mask(mask, tuple(scores.shape))
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    if sinks is None:
        weights = torch.softmax(scores, dim=-1)
    else:  # (batch, heads, q_len, 1): the sink's column, then dropped
        column = sinks.to(scores.dtype).reshape(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        weights = torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)[..., :-1]
    return weights if mask is None else weights.masked_fill(~mask, 0.0)


class NoMask(AttentionMask):
    """Every key is visible (besides padding): the encoder side of an encoder-decoder."""

    def __call__(self, q_positions: Tensor, k_positions: Tensor) -> None:
        return None
