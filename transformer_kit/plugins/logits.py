"""Built-in logits processors (kind ``logits_processor``), on numpy scores (rows, vocab).

Each computes what the Hugging Face processor of the same role computes, so greedy and beam
search choose the tokens ``transformers``' ``generate`` chooses; the differences are noted.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from transformer_kit.core.decoding import DecodingState, LogitsProcessor

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
        ids = np.where(state.real, state.ids, vocab)
        seen[np.arange(rows)[:, None], ids] = True
        seen = seen[:, :vocab]
        penalized = np.where(scores < 0, scores * self.penalty, scores / self.penalty)
        return np.where(seen, penalized, scores).astype(scores.dtype, copy=False)


class PresenceFrequencyPenalty(LogitsProcessor):
    """OpenAI's (and vLLM's) presence and frequency penalties over the tokens generated so far,
    the prompt's not counted: ``score[t] -= presence * (count[t] > 0) + frequency * count[t]``.
    Unlike ``repetition_penalty`` (transformers' and vLLM's, over the prompt too, by a factor)
    they subtract, so a score's sign does not matter."""

    def __init__(self, presence: float = 0.0, frequency: float = 0.0) -> None:
        for name, value in (("presence", presence), ("frequency", frequency)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
        self.presence, self.frequency = float(presence), float(frequency)

    def __call__(self, scores: np.ndarray, state: DecodingState) -> np.ndarray:
        rows, vocab = scores.shape
        new = state.ids[:, state.prompt_length:]
        if not new.size:
            return scores
        # one bincount over every row's ids offset into its own range (padding: a spare column)
        ids = np.where(state.real[:, state.prompt_length:], new, vocab)
        ids = ids + (vocab + 1) * np.arange(rows)[:, None]
        counts = np.bincount(ids.ravel(), minlength=rows * (vocab + 1)).reshape(rows, vocab + 1)[:, :vocab]
        penalty = self.frequency * counts.astype(np.float32) + np.float32(self.presence) * (counts > 0)
        scores -= penalty.astype(scores.dtype, copy=False)  # the pipeline's scores are the caller's copy
        return scores


class LogitBias(LogitsProcessor):
    """``bias[id]`` added to token ``id``'s score in every row (OpenAI's ``logit_bias``; what
    transformers' SequenceBiasLogitsProcessor does for sequences of one token)."""

    reads_tokens = False

    def __init__(self, bias: dict[int, float], vocab_size: int) -> None:
        if not isinstance(bias, dict) or not bias:
            raise ValueError(f"bias must be a non-empty dict of token id -> number, got {bias!r}")
        for token, value in bias.items():
            if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < vocab_size:
                raise ValueError(f"bias names token {token!r}; give ids from 0 to {vocab_size - 1}")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
                raise ValueError(f"bias of token {token} must be a finite number, got {value!r}")
        self.ids = np.array(list(bias), np.int64)
        self.values = np.array(list(bias.values()), np.float32)

    def __call__(self, scores: np.ndarray, state: DecodingState) -> np.ndarray:
        scores[:, self.ids] += self.values.astype(scores.dtype, copy=False)
        return scores


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
            windows, real = state.ids[:, :, None], state.real[:, :, None]
        else:
            windows = sliding_window_view(state.ids, n, axis=1)  # (rows, length - n + 1, n)
            real = sliding_window_view(state.real, n, axis=1)
        prefix = state.ids[:, length - n + 1:]  # the last n - 1 tokens
        matches = (windows[..., :-1] == prefix[:, None, :]).all(-1) & real.all(-1)
        rows, where = np.nonzero(matches)
        scores = scores.copy()
        scores[rows, windows[rows, where, -1]] = NEVER
        return scores


class MinNewTokens(LogitsProcessor):
    """End-of-sequence ids cannot be chosen before ``count`` new tokens."""

    reads_tokens = False

    def __init__(self, count: int, eos_ids: list[int]) -> None:
        self.count = _count("count", count)
        self.eos_ids = list(eos_ids)

    def __call__(self, scores: np.ndarray, state: DecodingState) -> np.ndarray:
        if state.new_tokens < self.count and self.eos_ids:
            scores[:, self.eos_ids] = NEVER  # the pipeline's scores are the caller's copy
        return scores


def _token_ids(name: str, ids: list[int], vocab_size: int) -> list[int]:
    if not isinstance(ids, (list, tuple)) or not all(
            isinstance(i, int) and not isinstance(i, bool) and 0 <= i < vocab_size for i in ids):
        raise ValueError(f"{name} must be a list of token ids from 0 to {vocab_size - 1}, got {ids!r}")
    return sorted(set(ids))


class SuppressTokens(LogitsProcessor):
    """``token_ids`` are never chosen (Whisper's suppress_tokens: transformers'
    SuppressTokensLogitsProcessor)."""

    reads_tokens = False

    def __init__(self, token_ids: list[int], vocab_size: int) -> None:
        self.token_ids = _token_ids("token_ids", token_ids, vocab_size)

    def __call__(self, scores: np.ndarray, state: DecodingState) -> np.ndarray:
        scores[:, self.token_ids] = NEVER
        return scores


class SuppressAtBegin(LogitsProcessor):
    """``token_ids`` are never the first new token (Whisper's begin_suppress_tokens, a blank
    and the end of text: transformers' SuppressTokensAtBeginLogitsProcessor)."""

    reads_tokens = False

    def __init__(self, token_ids: list[int], vocab_size: int) -> None:
        self.token_ids = _token_ids("token_ids", token_ids, vocab_size)

    def __call__(self, scores: np.ndarray, state: DecodingState) -> np.ndarray:
        if state.new_tokens == 0:
            scores[:, self.token_ids] = NEVER
        return scores


class ForcedFirstToken(LogitsProcessor):
    """The first new token is ``token_id`` in every row (Hugging Face's
    ForcedBOSTokenLogitsProcessor: every other score -inf, this one 0)."""

    reads_tokens = False

    def __init__(self, token_id: int, vocab_size: int) -> None:
        self.token_id = _count("token_id", token_id, least=0)
        if self.token_id >= vocab_size:
            raise ValueError(f"token_id must be below the vocabulary size ({vocab_size}), got {token_id}")

    def __call__(self, scores: np.ndarray, state: DecodingState) -> np.ndarray:
        if state.new_tokens == 0:
            scores[:] = NEVER
            scores[:, self.token_id] = 0.0
        return scores


class Temperature(LogitsProcessor):
    """Scores divided by ``value``: below 1 sharpens the distribution, above 1 flattens it.

    A ``value`` so small that a score divided by it leaves the float range (under about 1e-37
    for float32 scores) divides each row's scores less its best instead, in float64: the same
    distribution, whose limit is greedy's (the best tokens only), never infinite scores whose
    softmax is NaN."""

    reads_tokens = False

    def __init__(self, value: float) -> None:
        self.value = _positive("value", value)

    def __call__(self, scores: np.ndarray, state: DecodingState) -> np.ndarray:
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            scaled = (scores / self.value).astype(scores.dtype, copy=False)
            if np.array_equal(np.isfinite(scaled), np.isfinite(scores)):
                return scaled
            wide = scores.astype(np.float64)
            return ((wide - wide.max(axis=-1, keepdims=True)) / self.value).astype(scores.dtype)


class TopK(LogitsProcessor):
    """Keeps the ``k`` highest scores (ties with the k-th kept too)."""

    reads_tokens = False

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
    """Nucleus sampling: keeps the most likely tokens whose probabilities sum to ``p``: a token
    stays when the tokens more likely than it hold less than ``p`` (transformers' rule).

    Only candidates are sorted: the finite scores (after top-k, a few), else the 1024 most
    likely when they already hold ``p`` (``argpartition`` is linear in the vocabulary; a full
    sort of 50k scores costs milliseconds), else everything.
    """

    reads_tokens = False

    PARTIAL = 1024

    def __init__(self, p: float, min_tokens_to_keep: int = 1) -> None:
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p <= 1:
            raise ValueError(f"p must be in (0, 1], got {p!r}")
        self.p, self.keep = float(p), min_tokens_to_keep

    def _candidates(self, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """(rows, k) ids holding every token that can stay (padded with -inf ones), and the
        softmax normaliser (sum of exp(score - max), (rows, 1)) when they are not all finite ones."""
        vocab = scores.shape[-1]
        finite = scores > -np.inf
        count = max(int(finite.sum(axis=-1).max()), self.keep)
        if count * 4 < vocab:  # after top-k: only the finite scores (rows padded with a -inf one)
            rows = [np.flatnonzero(row) for row in finite]
            pads = np.argmin(scores, axis=-1)
            return np.stack([np.concatenate([ids, np.full(count - len(ids), pad)])
                             for ids, pad in zip(rows, pads, strict=True)]), None
        k = max(self.PARTIAL, self.keep)
        if k * 4 < vocab:  # the most likely, if they hold p
            top = np.argpartition(-scores, k - 1, axis=-1)[:, :k]
            peak = scores.max(axis=-1, keepdims=True).astype(np.float64)
            total = np.exp(scores - peak).sum(axis=-1, keepdims=True)
            mass = np.exp(np.take_along_axis(scores, top, -1) - peak).sum(axis=-1, keepdims=True)
            if (mass >= self.p * total).all():
                return top, total
        return np.broadcast_to(np.arange(vocab), scores.shape), None

    def __call__(self, scores: np.ndarray, state: DecodingState) -> np.ndarray:
        top, total = self._candidates(scores)
        top_scores = np.take_along_axis(scores, top, -1).astype(np.float64)
        order = np.argsort(-top_scores, axis=-1, kind="stable")
        ranked, ranked_scores = np.take_along_axis(top, order, -1), np.take_along_axis(top_scores, order, -1)
        if total is None:  # the candidates hold every finite score
            ranked_probs = _softmax(ranked_scores)
        else:
            ranked_probs = np.exp(ranked_scores - ranked_scores[:, :1]) / total
        above = np.cumsum(ranked_probs, axis=-1) - ranked_probs  # mass of the more likely tokens
        stays = above < self.p
        stays[:, :self.keep] = True
        kept = np.zeros(scores.shape, dtype=bool)
        np.put_along_axis(kept, ranked, stays, -1)
        return np.where(kept, scores, NEVER).astype(scores.dtype, copy=False)


class MinP(LogitsProcessor):
    """Keeps tokens whose probability is at least ``p`` x the most likely token's."""

    reads_tokens = False

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
