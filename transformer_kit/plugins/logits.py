"""Built-in logits processors (kind ``logits_processor``), on numpy scores (rows, vocab).

Each computes what the Hugging Face processor of the same role computes, so greedy and beam
search choose the tokens ``transformers``' ``generate`` chooses; the differences are noted.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from transformer_kit.decoding import DecodingState, LogitsProcessor

NEVER = -np.inf


def _positive(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a positive number, got {value!r}")
    return float(value)


def _count(name: str, value: int, least: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")
    return value


class RepetitionPenalty(LogitsProcessor):
    """Scores of tokens already in the row (padding excluded) are divided by ``penalty`` when
    positive and multiplied when negative (CTRL, Keskar et al. 2019)."""

    def __init__(self, penalty: float) -> None:
        self.penalty = _positive("penalty", penalty)

    def __call__(self, scores: np.ndarray, state: DecodingState) -> np.ndarray:
        rows, vocab = scores.shape
        seen = np.zeros((rows, vocab + 1), dtype=bool)  # padding goes to the spare column
        ids = np.where(state.keep, state.ids, vocab)
        seen[np.arange(rows)[:, None], ids] = True
        seen = seen[:, :vocab]
        penalized = np.where(scores < 0, scores * self.penalty, scores / self.penalty)
        return np.where(seen, penalized, scores).astype(scores.dtype, copy=False)


class NoRepeatNGram(LogitsProcessor):
    """Bans the token that would complete an n-gram already in the row (windows over padding
    are not n-grams; Hugging Face counts them, which differs only when pad ids are generated)."""

    def __init__(self, size: int) -> None:
        self.size = _count("size", size)

    def __call__(self, scores: np.ndarray, state: DecodingState) -> np.ndarray:
        n, length = self.size, state.ids.shape[1]
        if length < n:
            return scores
        if n == 1:
            windows, real = state.ids[:, :, None], state.keep[:, :, None]
        else:
            windows = sliding_window_view(state.ids, n, axis=1)  # (rows, length - n + 1, n)
            real = sliding_window_view(state.keep, n, axis=1)
        prefix = state.ids[:, length - n + 1:]  # the last n - 1 tokens
        matches = (windows[..., :-1] == prefix[:, None, :]).all(-1) & real.all(-1)
        rows, where = np.nonzero(matches)
        scores = scores.copy()
        scores[rows, windows[rows, where, -1]] = NEVER
        return scores


class MinNewTokens(LogitsProcessor):
    """End-of-sequence ids cannot be chosen before ``count`` new tokens."""

    def __init__(self, count: int, eos_ids: list[int]) -> None:
        self.count = _count("count", count)
        self.eos_ids = list(eos_ids)

    def __call__(self, scores: np.ndarray, state: DecodingState) -> np.ndarray:
        if state.new_tokens < self.count and self.eos_ids:
            scores = scores.copy()
            scores[:, self.eos_ids] = NEVER
        return scores


class Temperature(LogitsProcessor):
    """Scores divided by ``value``: below 1 sharpens the distribution, above 1 flattens it."""

    def __init__(self, value: float) -> None:
        self.value = _positive("value", value)

    def __call__(self, scores: np.ndarray, state: DecodingState) -> np.ndarray:
        return (scores / self.value).astype(scores.dtype, copy=False)


class TopK(LogitsProcessor):
    """Keeps the ``k`` highest scores (ties with the k-th kept too)."""

    def __init__(self, k: int, min_tokens_to_keep: int = 1) -> None:
        self.k = max(_count("k", k), min_tokens_to_keep)

    def __call__(self, scores: np.ndarray, state: DecodingState) -> np.ndarray:
        k = min(self.k, scores.shape[-1])
        kth = np.partition(scores, -k, axis=-1)[:, -k, None]
        return np.where(scores < kth, NEVER, scores).astype(scores.dtype, copy=False)


def _softmax(scores: np.ndarray) -> np.ndarray:
    shifted = scores - scores.max(axis=-1, keepdims=True)
    e = np.exp(shifted)
    return e / e.sum(axis=-1, keepdims=True)


class TopP(LogitsProcessor):
    """Nucleus sampling: keeps the most likely tokens whose probabilities sum to ``p``."""

    def __init__(self, p: float, min_tokens_to_keep: int = 1) -> None:
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p <= 1:
            raise ValueError(f"p must be in (0, 1], got {p!r}")
        self.p, self.keep = float(p), min_tokens_to_keep

    def __call__(self, scores: np.ndarray, state: DecodingState) -> np.ndarray:
        order = np.argsort(scores, axis=-1, kind="stable")  # ascending
        cumulative = np.cumsum(_softmax(np.take_along_axis(scores, order, -1)), axis=-1)
        remove_sorted = cumulative <= 1 - self.p
        remove_sorted[:, -self.keep:] = False
        remove = np.empty_like(remove_sorted)
        np.put_along_axis(remove, order, remove_sorted, -1)
        return np.where(remove, NEVER, scores).astype(scores.dtype, copy=False)


class MinP(LogitsProcessor):
    """Keeps tokens whose probability is at least ``p`` x the most likely token's."""

    def __init__(self, p: float, min_tokens_to_keep: int = 1) -> None:
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p <= 1:
            raise ValueError(f"p must be in [0, 1], got {p!r}")
        self.p, self.keep = float(p), min_tokens_to_keep

    def __call__(self, scores: np.ndarray, state: DecodingState) -> np.ndarray:
        probs = _softmax(scores)
        remove = probs < self.p * probs.max(axis=-1, keepdims=True)
        k = min(self.keep, scores.shape[-1])
        top = np.argpartition(-probs, k - 1, axis=-1)[:, :k]
        np.put_along_axis(remove, top, False, -1)
        return np.where(remove, NEVER, scores).astype(scores.dtype, copy=False)
