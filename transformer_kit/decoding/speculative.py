"""Speculative decoding with prompt lookup: tokens drafted from the text so far, checked by the
model in one step.

Prompt lookup (transformers' ``prompt_lookup_num_tokens``, its ``PromptLookupCandidateGenerator``):
the last ``max_matching_ngram_size`` ids (then fewer) are looked up earlier in the prompt and the
output so far, and the ids that followed their first earlier occurrence are the draft. One step
of the model runs the last chosen token and the draft together and gives the logits after each
(:meth:`verify` of the runtime's stepper); the tokens are then chosen from those logits one by one,
exactly as plain decoding chooses them, and the first drafted token that differs from the chosen
one ends the check: its cache column and those after it are dropped. Every chosen token is one
plain decoding would choose from the same logits, so greedy search gives plain greedy's tokens.

Sampling uses speculative sampling (Leviathan et al., 2023) with the draft as a point mass: a
drafted token d is accepted with probability p(d) (p: the processed distribution at that
position), else a token is drawn from p without d, renormalized, which is p itself in total. The
tokens are distributed as plain sampling's; the draws differ, so the same seed gives other tokens.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from transformer_kit.decoding.options import GenerationConfig
from transformer_kit.decoding.processors import Pipeline
from transformer_kit.errors import InputError


def prompt_lookup(ids: np.ndarray, max_ngram: int, count: int, eos_ids: list[int]) -> np.ndarray:
    """The draft after ``ids`` (length,) int64: up to ``count`` ids that followed the first
    earlier occurrence of its last n ids (n from ``max_ngram`` down to 1), cut before an end id;
    empty when none occurs earlier (transformers' prompt lookup)."""
    length = len(ids)
    if count < 1:
        return ids[:0]
    for n in range(min(max_ngram, length - 1), 0, -1):
        windows = np.lib.stride_tricks.sliding_window_view(ids[:length - 1], n)  # not the last one
        found = np.flatnonzero((windows == ids[length - n:]).all(axis=1))
        if len(found):
            start = int(found[0]) + n
            draft = ids[start:start + count]
            ends = np.flatnonzero(np.isin(draft, eos_ids)) if eos_ids else ()
            return draft[:ends[0]] if len(ends) else draft
    return ids[:0]


def check_speculative(stepper, rows: int, options: GenerationConfig) -> None:
    """Refuse, with a sentence, what prompt lookup cannot draft for."""
    if rows != 1:
        raise InputError(f"prompt_lookup_num_tokens drafts for one prompt at a time, and {rows} rows "
                         "were given; decode the prompts one by one, or leave the option out.")
    if not getattr(stepper, "verifies", False):
        raise InputError("prompt_lookup_num_tokens needs a decoder whose step gives several "
                         "positions' logits: a decoder-only model, exported by this version of "
                         "transformer-kit (export it again), or leave the option out.")


class _Chooser:
    """Chooses each token as plain decoding does (greedy or sampling, processors applied to the
    history so far), and decides whether a drafted token stands."""

    def __init__(self, problem, options: GenerationConfig, pipeline: Pipeline) -> None:
        from transformer_kit.decoding.search import History

        self.rng = np.random.default_rng(options.seed) if options.do_sample else None
        self.pipeline, self.width = pipeline, problem.prompt_ids.shape[1]
        self.history = History(problem.prompt_ids.copy(), problem.prompt_keep.copy())

    def ids(self) -> np.ndarray:
        """(length,) the row's ids so far, padding left out."""
        h = self.history
        return h.ids[0, :h.length][h.keep[0, :h.length]]

    def choose(self, logits: np.ndarray, draft: int | None) -> int:
        """The token after ``logits`` (vocab,), given the drafted one (or None)."""
        from transformer_kit.decoding.search import _probabilities, sample_rows

        scores = logits[None]
        if len(self.pipeline):
            scores = self.pipeline(scores.astype(np.float32, copy=False), self.history.state(self.width))
        if self.rng is None:
            return int(scores[0].argmax())
        if draft is None:
            return int(sample_rows(scores, self.rng)[0])
        probabilities = _probabilities(scores[0])
        if self.rng.random() < probabilities[draft]:
            return draft
        rest = scores[0].copy()
        rest[draft] = -np.inf  # p without the draft, renormalized: what rejection samples from
        return int(sample_rows(rest[None], self.rng)[0])

    def append(self, token: int) -> None:
        self.history.append(np.array([token], np.int64))


class DraftLength:
    """How many tokens to draft next, from how the drafts of this row fared (tokens only, never
    time: sampling's draws stay a function of the seed).

    Starts at ``most``; a draft accepted whole lets the next be 2 longer (up to ``most``), one
    accepted in part makes the next one token longer than the accepted part. A draft rejected at
    its first token makes the next one 1 long and pauses drafting for 2, 4, ... up to 16 tokens
    (reset by the next accepted token): on text with nothing to copy, chance matches then cost
    a few two-token steps in a reply, not a long step every token.
    """

    #: The longest pause after drafts rejected at their first token, in tokens.
    MAX_PAUSE = 16

    def __init__(self, most: int) -> None:
        self.most, self.length, self.failures, self.resume = most, most, 0, 0

    def now(self, produced: int, left: int) -> int:
        """Tokens to draft after ``produced`` tokens with ``left`` still to produce (0: none)."""
        return 0 if produced < self.resume else min(self.length, left - 1)

    def update(self, produced: int, drafted: int, accepted: int) -> None:
        if accepted == drafted:
            self.length, self.failures = min(self.most, self.length + 2), 0
        elif accepted:
            self.length, self.failures = min(self.most, accepted + 1), 0
        else:
            self.failures += 1
            self.length = 1
            self.resume = produced + min(2 ** self.failures, self.MAX_PAUSE)


def speculative_tokens(stepper, problem, options: GenerationConfig,
                       pipeline: Pipeline) -> Iterator[np.ndarray]:
    """Greedy search or sampling of one row with prompt lookup; yields (1,) int64 per token, as
    :func:`~transformer_kit.decoding.search.stream_tokens` does."""
    from transformer_kit.decoding.search import stopped

    check_speculative(stepper, len(problem.prompt_ids), options)
    if options.max_new_tokens == 0:
        return
    chooser, eos = _Chooser(problem, options, pipeline), frozenset(problem.eos_ids)
    length = DraftLength(options.prompt_lookup_num_tokens)
    new: list[np.ndarray] = []
    logits, drafts = stepper.first(), np.zeros(0, np.int64)
    while True:
        for j, row in enumerate(logits):
            drafted = int(drafts[j]) if j < len(drafts) else None
            token = chooser.choose(row, drafted)
            new.append(np.array([token], np.int64))
            yield new[-1]
            ended = stopped(problem, options, new[-1], eos, new)
            if len(new) == options.max_new_tokens or (ended is not None and ended[0]):
                return
            chooser.append(token)
            if drafted is not None and token != drafted:
                stepper.drop(len(drafts) - j)  # the rejected draft and every one after it
                break
        if len(drafts):
            length.update(len(new), len(drafts), j)
        count = length.now(len(new), options.max_new_tokens - len(new))  # the step gives one more
        drafts = prompt_lookup(chooser.ids(), options.max_matching_ngram_size, count, problem.eos_ids)
        last = new[-1]
        logits = (stepper.verify(np.concatenate([last, drafts])) if len(drafts)
                  else stepper.next(last, None))
