"""Token-id checks shared by the PyTorch models and the onnxruntime runtime (no torch here),
so both refuse the same inputs with the same sentences."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from transformer_kit.core.errors import InputError


def check_id_array(name: str, is_integer: bool, dtype: object, shape: Sequence[int],
                   bounds: Callable[[], tuple[int, int]], vocab_size: int) -> None:
    """Refuse ids that are not a non-empty (batch, len) integer array within [0, vocab_size).

    Args:
        is_integer: whether the dtype holds integers (bool does not count).
        bounds: returns (min, max) of the ids; called only once shape and dtype are right.
    """
    shape = tuple(shape)
    if not is_integer:
        raise InputError(f"{name} must hold integer token ids, got dtype {dtype}; use int64.")
    if len(shape) != 2:
        raise InputError(f"{name} must have shape (batch, len), got shape {shape}; add a batch "
                         "axis in front (ids[None]).")
    if 0 in shape:
        raise InputError(f"{name} is empty (shape {shape}); give at least one token in at least "
                         "one row.")
    low, high = bounds()
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise InputError(f"{name} holds token id {bad}, outside the vocabulary 0..{vocab_size - 1}.")


def check_positions(needed: int, max_positions: int | None, name: str) -> None:
    """Refuse sequences longer than bounded positions allow."""
    if max_positions is not None and needed > max_positions:
        raise InputError(
            f"{name} needs {needed} positions, but the model's positions cover {max_positions} "
            "(max_len). Shorten the input or build the model with a larger max_len."
        )
