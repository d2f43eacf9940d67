"""Prompts before decoding, the same for every runtime: attention masks, left alignment, room
in the context, and what a finished row holds."""

from __future__ import annotations

from typing import Any

import numpy as np

from transformer_kit.core.decoding.options import GenerationConfig
from transformer_kit.core.decoding.processors import Pipeline, build_pipeline
from transformer_kit.core.decoding.search import DecodingCall
from transformer_kit.core.errors import ContextLengthError, InputError
from transformer_kit.core.id_checks import check_positions


def as_array(x: Any, name: str) -> np.ndarray:
    """A numpy view of a numpy array, torch tensor or nested list."""
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # a torch tensor, without importing torch
        x = x.detach().cpu().numpy()
    elif isinstance(x, (list, tuple)):
        x = np.asarray(x)
    if not isinstance(x, np.ndarray):
        raise InputError(f"{name} must be a numpy array or torch tensor, got {type(x).__name__}.")
    return x


def real_from_mask(attention_mask: Any, shape: tuple[int, ...], name: str = "attention_mask"
                   ) -> np.ndarray:
    """(batch, len) bool, True for real tokens, from a 0/1 (or boolean) ``attention_mask``
    given as transformers takes it: 1 = real token, 0 = padding."""
    mask = as_array(attention_mask, name)
    if mask.shape != tuple(shape):
        raise InputError(f"{name} has shape {tuple(mask.shape)} but the ids have shape "
                         f"{tuple(shape)}; give one 0/1 entry per token (1 = real token).")
    if mask.dtype != bool:
        if mask.dtype.kind not in "iuf" or not np.isin(mask, (0, 1)).all():
            raise InputError(f"{name} must hold 0 and 1 only (1 = real token, 0 = padding), got "
                             f"dtype {mask.dtype} with values {np.unique(mask)[:5].tolist()}.")
        mask = mask != 0
    return mask


def real_from_pad(ids: np.ndarray, pad_id: int | None) -> np.ndarray:
    """(batch, len) bool, True where ``ids`` is not ``pad_id`` (all True without a pad id)."""
    return np.ones(ids.shape, dtype=bool) if pad_id is None else ids != pad_id


def left_align(ids: np.ndarray, real: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Move each row's padding to the left (token order kept) and drop columns that are
    padding in every row: ids (batch, len) int64, real (batch, len) bool, narrower or equal.
    Rows that hold no real token are refused."""
    empty = np.flatnonzero(~real.any(axis=1)).tolist()
    if empty:
        raise InputError(f"Prompt rows {empty} hold only padding; give every row at least one "
                         "real token.")
    order = np.argsort(real.astype(np.int8), axis=1, kind="stable")
    ids, real = np.take_along_axis(ids, order, 1), np.take_along_axis(real, order, 1)
    first = int(real.any(axis=0).argmax())
    return np.ascontiguousarray(ids[:, first:], dtype=np.int64), real[:, first:]


def check_room(used: int, options: GenerationConfig, context_length: int | None,
               what: str = "prompt") -> None:
    """Refuse a call whose prompt plus ``max_new_tokens`` does not fit the model's context."""
    if context_length is not None and used + options.max_new_tokens > context_length:
        raise ContextLengthError(
            f"The {what} takes {used} positions and max_new_tokens is {options.max_new_tokens}, "
            f"{used + options.max_new_tokens} in all, but the model's context length is "
            f"{context_length}; shorten the {what} or lower max_new_tokens to at most "
            f"{max(context_length - used, 0)}."
        )


def fill_id(pad_id: int | None, eos_ids: list[int]) -> int:
    """What a row holds after it ended: the pad id, else the first eos id, else 0."""
    if pad_id is not None:
        return pad_id
    return eos_ids[0] if eos_ids else 0


def check_stop(options: GenerationConfig, stop: object) -> None:
    """Stop strings are matched on decoded text, so they need the model's tokenizer."""
    if options.stop and stop is None:
        raise InputError(f"stop={options.stop!r} needs a tokenizer to match text, and this call "
                         "has none; generate from text with a model that carries its tokenizer, "
                         "or end rows by token with eos_id=[...].")


def check_biased_ids(options: GenerationConfig, vocab: int) -> None:
    """Refuse a ``logit_bias`` naming a token outside the model's vocabulary of ``vocab`` ids."""
    outside = sorted(t for t in options.logit_bias or {} if t >= vocab)
    if outside:
        raise InputError(f"logit_bias names token {outside[0]}, outside this model's vocabulary of "
                         f"{vocab} ids (0 to {vocab - 1}); give ids below {vocab}.")


def prepare_call(ids: np.ndarray, attention_mask: Any, options: GenerationConfig, *, decoder: bool,
         pad_id: int | None, eos_id: int | None, bos_id: int | None, vocab: int,
         context_length: int | None, source_positions: int | None = None,
         stop_matcher=None, forced_bos_id: int | None = None,
         tokenizer: Any = None, decoder_prompt: Any = None) -> tuple[DecodingCall, Pipeline, np.ndarray]:
    """What every runtime prepares before decoding checked ``ids`` (batch, len) int64 (an
    encoder-decoder whose source is features: (batch, 0), no token ids).

    Returns the call for the strategies (decoder: the prompts left-aligned; encoder-decoder:
    the start token, or ``decoder_prompt``), the processors, and real (batch, len') bool: the
    aligned prompt's, or the source's. ``source_positions``: the positional bound the source
    must fit, if checked here. ``decoder_prompt`` (encoder-decoder): the tokens the target
    starts with, (batch, k) or (k,) for every row (Whisper's start of transcript, language and
    task), instead of ``bos_id`` alone.
    """
    real = (real_from_pad(ids, pad_id) if attention_mask is None
            else real_from_mask(attention_mask, ids.shape))
    eos_ids = options.eos_ids(eos_id)
    check_biased_ids(options, vocab)
    _, pipeline = build_pipeline(options, vocab, eos_ids, forced_bos_id=forced_bos_id,
                                 tokenizer=tokenizer)
    fill = fill_id(pad_id, eos_ids)
    if decoder:
        ids, real = left_align(ids, real)
        check_room(int(real.sum(axis=1).max()), options, context_length)
        return DecodingCall(ids, real, eos_ids, fill, stop_matcher), pipeline, real
    if source_positions is not None:
        check_positions(int(real.sum(axis=1).max()) if real.size else 0, source_positions, "src_ids")
    start = (np.full((len(ids), 1), bos_id, np.int64) if decoder_prompt is None
             else decoder_start(decoder_prompt, len(ids), vocab))
    check_room(start.shape[1], options, context_length,
               "decoder start token" if decoder_prompt is None else "decoder prompt")
    return DecodingCall(start, np.ones(start.shape, bool), eos_ids, fill, stop_matcher), pipeline, real


def check_source_inputs(*, decoder: bool, features: bool, attention_mask: Any,
                        decoder_prompt: Any = None) -> None:
    """What every runtime refuses before looking at the source: a decoder prompt for a decoder
    (its prompt is its input ids), an attention mask for features (they have no padding)."""
    if decoder_prompt is not None and decoder:
        raise InputError("decoder_input_ids start an encoder-decoder's target; a decoder's "
                         "prompt is its input_ids.")
    if features and attention_mask is not None:
        raise InputError("This model's source is features, which have no padding; give no "
                         "attention_mask.")


def decoder_start(prompt: Any, batch: int, vocab: int) -> np.ndarray:
    """An encoder-decoder's target prompt as (batch, k) int64: ``prompt`` (k,) for every row
    or (batch, k), k >= 1, its ids within the target vocabulary."""
    ids = as_array(prompt, "decoder_input_ids")
    if ids.ndim == 1:
        ids = np.broadcast_to(ids, (batch, len(ids)))
    if ids.ndim != 2 or ids.shape[0] != batch or ids.shape[1] == 0 or ids.dtype.kind not in "iu":
        raise InputError(f"decoder_input_ids must be k >= 1 integer ids, (k,) for every row or "
                         f"({batch}, k); got dtype {ids.dtype} of shape {tuple(ids.shape)}.")
    if int(ids.min()) < 0 or int(ids.max()) >= vocab:
        raise InputError(f"decoder_input_ids hold ids from {int(ids.min())} to {int(ids.max())}, "
                         f"but the target vocabulary has {vocab} ids (0 to {vocab - 1}).")
    return np.ascontiguousarray(ids, dtype=np.int64)
