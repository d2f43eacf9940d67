"""What every decoding strategy shares: the call (:class:`DecodingCall`), the runtime's steps
(:class:`Stepper`), a row's history, a draw from a row's scores and the end of a row."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from transformer_kit.core.decoding.logprobs import TokenLogprob
from transformer_kit.core.decoding.options import GenerationConfig
from transformer_kit.core.decoding.processors import DecodingState


class Stepper(Protocol):
    """One runtime's decoding steps."""

    def first(self) -> np.ndarray:
        """Run the prompt; next-token logits (prompt_rows, vocab) float32 (or the model's
        float dtype). Logits returned are the caller's to change until the next call."""

    def next(self, tokens: np.ndarray, rows: np.ndarray | None) -> np.ndarray:
        """Append ``tokens`` (n,) int64 and return the next logits (n, vocab).

        ``rows`` (n,): the cache row each row continues (beam reorder, or the prompt rows
        repeated for several beams or samples); None keeps the rows as they are.
        """


@dataclass
class DecodingCall:
    """One decoding call.

    prompt_ids, prompt_real: (batch, length) left-padded prompt ids and True for real tokens
        (for encoder-decoder models: the decoder start token, all True).
    eos_ids: ids that end a row; fill_id: what a row holds after it ended.
    stop: called with the rows' new tokens (rows, n) -> (rows,) bool, True where a stop string
        just completed; or None.
    assistant: an assistant model's :class:`Stepper` over the same prompt (speculative decoding
        with a draft model), or None.
    logprobs: with the option ``logprobs``, each step's reports, one per row (None for a row
        that had ended).
    """

    prompt_ids: np.ndarray
    prompt_real: np.ndarray
    eos_ids: list[int]
    fill_id: int
    stop: Callable[[np.ndarray], np.ndarray] | None = None
    assistant: Stepper | None = None
    logprobs: list[list[TokenLogprob | None]] = field(default_factory=list)


def _probabilities(scores: np.ndarray) -> np.ndarray:
    """softmax in float64 (so the sampler's cumulative sums are exact to well below 1e-9)."""
    scores = scores.astype(np.float64)
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def sample_rows(scores: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One token per row drawn from softmax(scores): inverse CDF of one uniform draw per row,
    over the row's finite scores in id order (the same draw as over the whole vocabulary, and
    a few tokens to visit after top-k/top-p/min-p).

    scores: (rows, vocab), -inf for tokens never chosen. Returns (rows,) int64.
    """
    draws = rng.random(len(scores))
    chosen = np.empty(len(scores), dtype=np.int64)
    for row, (values, draw) in enumerate(zip(scores, draws, strict=True)):
        ids = np.flatnonzero(values > -np.inf)
        cumulative = np.cumsum(_probabilities(values[ids]))
        index = int((cumulative <= draw * cumulative[-1]).sum())
        chosen[row] = ids[min(index, len(ids) - 1)]
    return chosen


def stopped(call: DecodingCall, options: GenerationConfig, token: np.ndarray, eos: frozenset[int],
             new: list[np.ndarray]) -> np.ndarray | None:
    """(rows,) True where ``token`` ends its row (an id of ``eos``, a completed stop string);
    None where none did. Ids are checked as Python ints: after a decoding step has evicted the
    caches, each numpy call on a few ids costs microseconds."""
    ids = token.tolist()
    ended = None if eos.isdisjoint(ids) else np.array([t in eos for t in ids])
    if call.stop is not None and len(new) >= options.min_new_tokens:
        stops = call.stop(np.stack(new, axis=1))
        ended = stops if ended is None else ended | stops
    return ended


class History:
    """Each row's ids (rows, length) int64 and keep flags so far, in buffers that double when
    full (no copy of the whole history per step); ``state`` gives views of the columns so far."""

    def __init__(self, ids: np.ndarray, real: np.ndarray) -> None:
        self.length, self.ids, self.real = ids.shape[1], ids, real

    def state(self, prompt_length: int) -> DecodingState:
        return DecodingState(self.ids[:, :self.length], self.real[:, :self.length], prompt_length)

    def append(self, token: np.ndarray) -> None:
        if self.length == self.ids.shape[1]:  # full (first at the prompt's own arrays): double
            self.ids = np.concatenate([self.ids, np.empty_like(self.ids)], axis=1)
            self.real = np.concatenate([self.real, np.ones_like(self.real)], axis=1)
        self.ids[:, self.length] = token
        self.length += 1
