"""Checks on model inputs, done before any tensor work so errors say what was given."""

from __future__ import annotations

import torch
from torch import Tensor

from transformer_kit.errors import InputError


def tracing() -> bool:
    """True while torch.export / dynamo / jit trace the model (data checks are skipped then)."""
    return torch.compiler.is_compiling() or torch.jit.is_tracing()


def check_token_ids(ids: object, vocab_size: int, name: str = "input_ids") -> Tensor:
    """Refuse ids that are not a (batch, len) integer tensor with values in [0, vocab_size)."""
    if not isinstance(ids, Tensor):
        raise InputError(
            f"{name} must be a torch.Tensor of token ids, got {type(ids).__name__}; "
            "wrap it with torch.tensor(..., dtype=torch.long)."
        )
    if tracing():
        return ids
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise InputError(f"{name} must hold integer token ids, got dtype {ids.dtype}; "
                         "use .long().")
    if ids.dim() != 2:
        raise InputError(f"{name} must have shape (batch, len), got shape {tuple(ids.shape)}; "
                         "add a batch axis with ids.unsqueeze(0).")
    if ids.shape[0] == 0 or ids.shape[1] == 0:
        raise InputError(f"{name} is empty (shape {tuple(ids.shape)}); give at least one token "
                         "in at least one row.")
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise InputError(f"{name} holds token id {bad}, outside the vocabulary 0..{vocab_size - 1}.")
    return ids


def check_length(length: int, max_positions: int | None, name: str) -> None:
    """Refuse sequences longer than bounded positions allow."""
    if max_positions is not None and length > max_positions:
        raise InputError(
            f"{name} needs {length} positions, but the model's positions cover {max_positions} "
            "(max_len). Shorten the input or build the model with a larger max_len."
        )
