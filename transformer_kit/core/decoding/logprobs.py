"""Log probabilities of tokens, as OpenAI's ``logprobs`` and vLLM's ``prompt_logprobs`` report
them: the chosen (or given) token's log probability, its rank, and the most likely tokens.

A generated token's log probability is the log-softmax of the scores at its step: the model's
own logits (``logprobs_mode="raw"``, vLLM's ``raw_logprobs``, the default) or the scores the
token was chosen from, after the logits processors, the grammar and the sampling warpers
(``"processed"``, vLLM's ``processed_logprobs``). A prompt token's is the log-softmax of the
logits at the position before it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

#: Prompt positions whose log-softmax is taken at once (a bound on the float64 copy).
_CHUNK = 256
#: The most alternatives a token's report may list (OpenAI's bound on ``top_logprobs``).
MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True)
class TokenLogprob:
    """One token's log probability at its position.

    token_id: the token chosen (or given, in a prompt).
    logprob: its log probability (natural log), float32 precision.
    rank: 1 + how many tokens were more likely (1: the most likely).
    top: the most likely tokens at that position, (id, logprob) most likely first (ties: the
        lower id first); as many as asked for.
    """

    token_id: int
    logprob: float
    rank: int
    top: tuple[tuple[int, float], ...]


def log_softmax(scores: np.ndarray) -> np.ndarray:
    """scores (rows, vocab) -> log-softmax (rows, vocab) float32, computed in float64 (so it is
    within float32's rounding of transformers' float32 ``log_softmax``); -inf stays -inf."""
    x = scores.astype(np.float64)
    top = x.max(axis=-1, keepdims=True)
    shifted = x - np.where(np.isfinite(top), top, 0.0)
    return (shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))).astype(np.float32)


def top_indices(x: np.ndarray, k: int) -> np.ndarray:
    """(rows, k) indices of each row's k largest values of ``x`` (rows, n), largest first, ties
    by lower index (what a stable argsort of -x gives), without sorting the whole row."""
    if k == 0:
        return np.zeros((len(x), 0), np.int64)
    if 4 * k >= x.shape[-1]:
        return np.argsort(-x, axis=-1, kind="stable")[:, :k]
    n = x.shape[-1]
    kth = np.partition(x, n - k, axis=-1)[:, n - k:n - k + 1]  # each row's k-th largest
    rows = []
    for values, bound in zip(x, kth, strict=True):
        candidates = np.flatnonzero(values >= bound)  # the k largest and any tie at the k-th
        rows.append(candidates[np.argsort(-values[candidates], kind="stable")[:k]])
    return np.stack(rows)


def pick(logprobs: np.ndarray, tokens: np.ndarray, top: int) -> list[TokenLogprob]:
    """Each row's report: ``logprobs`` (rows, vocab) (:func:`log_softmax`'s), ``tokens`` (rows,)
    the token at each row, ``top`` how many of the most likely to list (0..20)."""
    best = top_indices(logprobs, top)
    out = []
    for row, token, ids in zip(logprobs, np.asarray(tokens).tolist(), best, strict=True):
        value = row[token]
        out.append(TokenLogprob(int(token), float(value), int((row > value).sum()) + 1,
                                tuple((int(i), float(row[i])) for i in ids)))
    return out


def prompt_logprobs(logits: np.ndarray, prompt: np.ndarray, top: int) -> list[TokenLogprob | None]:
    """A prompt's tokens' reports from the model's logits over it: ``logits`` (length, vocab)
    (position i's next-token logits), ``prompt`` (length,) int64; the first token has no
    position before it (None), as vLLM's ``prompt_logprobs`` and OpenAI's ``echo`` give it."""
    reports: list[TokenLogprob | None] = [None]
    for start in range(0, len(prompt) - 1, _CHUNK):  # float64 rows, a chunk at a time
        end = min(start + _CHUNK, len(prompt) - 1)
        reports.extend(pick(log_softmax(logits[start:end]), prompt[start + 1:end + 1], top))
    return reports[:len(prompt)]


class Generation(NamedTuple):
    """What ``generate`` returns with the option ``logprobs``: the tokens (or texts) it returns
    without it, and each row's reports, one per new token up to the row's end."""

    sequences: Any
    logprobs: list[list[TokenLogprob]]


def row_reports(steps: list[list[TokenLogprob | None]], rows: int) -> list[list[TokenLogprob]]:
    """Each row's reports from a decoding call's per-step ones (``DecodingCall.logprobs``; None
    once a row ended)."""
    return [[step[row] for step in steps if step[row] is not None] for row in range(rows)]
