"""Speculative decoding: tokens drafted cheaply, checked by the model in one step.

Two drafters. Prompt lookup (transformers' ``prompt_lookup_num_tokens``): the ids after the
best earlier match of the text's end, in the prompt and the output so far (:func:`prompt_lookup`).
An assistant model (transformers' ``assistant_model``): a smaller model with the same vocabulary
drafts up to ``num_assistant_tokens`` tokens one by one, as the model would choose them.

One step of the model runs the last chosen token and the draft together and gives the logits
after each (:meth:`verify` of the runtime's stepper); the tokens are then chosen from those
logits one by one, exactly as plain decoding chooses them, and the first drafted token that
differs from the chosen one ends the check: its cache column and those after it are dropped.
Every chosen token is one plain decoding would choose from the same logits, so greedy search
gives plain greedy's tokens.

Sampling uses speculative sampling (Leviathan et al., 2023): a drafted token d drawn from the
drafter's distribution q is kept with probability min(1, p(d) / q(d)) (p: the model's processed
distribution at that position), else a token is drawn from max(p - q, 0) renormalized; the
tokens are distributed as plain sampling's. Prompt lookup's q is a point mass on d: d is kept
with probability p(d), else drawn from p without d. The draws differ from plain sampling's, so
the same seed gives other tokens.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from transformer_kit.core.decoding.call import History, _probabilities, sample_rows, stopped
from transformer_kit.core.decoding.options import GenerationConfig
from transformer_kit.core.decoding.processors import Pipeline
from transformer_kit.core.errors import InputError

#: The longest match counted: enough for drafts of 2 ** (8 - 1) = 128 tokens (at most 64 asked).
LONGEST_MATCH = 8


def lookup_match(ids: np.ndarray, max_ngram: int) -> tuple[int, int]:
    """Where the text after ``ids`` (length,) int64 is looked up, and how well it matches:
    (start, matched). The last n ids (n from ``max_ngram`` down to 1, the first n that occurs
    earlier) are found earlier in ``ids``; of their earlier occurrences, the one whose preceding
    ids also match those before the last n for longest (ties: the latest) is taken; ``start`` is
    the index after it and ``matched`` how many ids match there (n and the matching ids before,
    at most :data:`LONGEST_MATCH`). (0, 0) when no id occurs earlier."""
    length = len(ids)
    for n in range(min(max_ngram, length - 1), 0, -1):
        windows = np.lib.stride_tricks.sliding_window_view(ids[:length - 1], n)  # not the last one
        found = np.flatnonzero((windows == ids[length - n:]).all(axis=1))
        if not len(found):
            continue
        back = np.arange(1, LONGEST_MATCH - n + 1)  # ids before the n-gram, nearest first
        before = found[:, None] - back  # (occurrences, back) indices before each occurrence
        own = length - n - back  # the same distances before the text's own last n ids
        same = (before >= 0) & (own >= 0) & (ids[np.maximum(before, 0)] == ids[np.maximum(own, 0)])
        extra = np.cumprod(same, axis=1).sum(axis=1)  # matching ids before each, in a row
        best = len(extra) - 1 - int(np.argmax(extra[::-1]))  # the longest; the latest of equals
        return int(found[best]) + n, n + int(extra[best])
    return 0, 0


def prompt_lookup(ids: np.ndarray, max_ngram: int, count: int, eos_ids: list[int]) -> np.ndarray:
    """The draft after ``ids`` (length,) int64: the ids after the best earlier match of its end
    (:func:`lookup_match`), up to ``count`` of them and at most 2 ** (matched - 1) (1 after a
    match of one id, 2 after two, 4 after three...: a long match is text being copied, a short
    one often chance), cut before an end id; empty when no id occurs earlier. With one earlier
    occurrence and a long match, transformers' ``PromptLookupCandidateGenerator`` drafts the same
    (of several, it takes the first occurrence and all ``count`` ids after it)."""
    start, matched = lookup_match(ids, max_ngram) if count >= 1 else (0, 0)
    if not matched:
        return ids[:0]
    draft = ids[start:start + min(count, 2 ** (matched - 1))]
    ends = np.flatnonzero(np.isin(draft, eos_ids)) if eos_ids else ()
    return draft[:ends[0]] if len(ends) else draft


def check_speculative(stepper, call, options: GenerationConfig) -> None:
    """Refuse, with a sentence, what speculative decoding cannot draft for."""
    rows, assistant = len(call.prompt_ids), call.assistant
    which = "an assistant model" if assistant is not None else "prompt_lookup_num_tokens"
    if assistant is not None and options.prompt_lookup_num_tokens is not None:
        raise InputError("Give either an assistant model or prompt_lookup_num_tokens: both draft "
                         "tokens, and one step checks one draft.")
    if rows != 1:
        raise InputError(f"{which} drafts for one prompt at a time, and {rows} rows were given; "
                         "decode the prompts one by one, or leave it out.")
    if options.num_beams > 1 or options.num_return_sequences > 1 or options.response_format:
        raise InputError(f"{which} drafts one row's tokens, so it cannot run with num_beams, "
                         "num_return_sequences above 1 or response_format; leave one of them out.")
    if options.logprobs is not None:  # the serving engine reports them with drafts; generate does not
        raise InputError(f"generate reports logprobs without drafts; leave out {which} or logprobs "
                         "(a served request reports them with prompt lookup too).")
    for role, runner in (("The model", stepper), ("The assistant model", assistant)):
        if runner is not None and not getattr(runner, "verifies", False):
            raise InputError(f"{role} cannot check drafted tokens: speculative decoding needs a "
                             "decoder-only model whose step gives several positions' logits "
                             "(an export made by this version of transformer-kit: export it again).")


def draft_or_draw(scores: np.ndarray, draft: int, rng: np.random.Generator,
                  q: np.ndarray | None = None) -> int:
    """Speculative sampling's choice at one position: ``draft`` kept with probability
    min(1, p(draft) / q(draft)), else a draw from max(p - q, 0) renormalized; p = softmax of the
    processed ``scores`` (vocab,), q the distribution the draft was drawn from (None: a point
    mass on it, as prompt lookup drafts, so that the draw is from p without the draft)."""
    p = _probabilities(scores)
    kept = p[draft] if q is None else min(1.0, p[draft] / q[draft])
    if rng.random() < kept:
        return draft
    if q is None:
        rest = scores.copy()
        rest[draft] = -np.inf  # p without the draft, renormalized: what rejection samples from
        return int(sample_rows(rest[None], rng)[0])
    residual = np.cumsum(np.maximum(p - q, 0.0))
    return int(min(np.searchsorted(residual, rng.random() * residual[-1], side="right"), len(residual) - 1))


class _Chooser:
    """Chooses each token as plain decoding does (greedy or sampling, processors applied to the
    history so far), and decides whether a drafted token stands."""

    def __init__(self, call, options: GenerationConfig, pipeline: Pipeline) -> None:
        self.rng = np.random.default_rng(options.seed) if options.do_sample else None
        self.pipeline, self.width = pipeline, call.prompt_ids.shape[1]
        self.history = History(call.prompt_ids.copy(), call.prompt_real.copy())

    def ids(self) -> np.ndarray:
        """(length,) the row's ids so far, padding left out."""
        h = self.history
        return h.ids[0, :h.length][h.real[0, :h.length]]

    def processed(self, logits: np.ndarray) -> np.ndarray:
        """(1, vocab) scores after the processors, for the history so far."""
        scores = logits[None]
        if len(self.pipeline):
            scores = self.pipeline(scores.astype(np.float32, copy=False), self.history.state(self.width))
        return scores

    def choose(self, logits: np.ndarray, draft: int | None, q: np.ndarray | None = None) -> int:
        """The token after ``logits`` (vocab,), given the drafted one (or None) and the
        distribution it was drawn from (vocab,) (None: a point mass on it)."""
        scores = self.processed(logits)
        if self.rng is None:
            return int(scores[0].argmax())
        if draft is None:
            return int(sample_rows(scores, self.rng)[0])
        return draft_or_draw(scores[0], draft, self.rng, q)

    def draw(self, logits: np.ndarray) -> tuple[int, np.ndarray | None]:
        """A drafted token from ``logits`` (vocab,) as this decoding chooses (its processors for
        the history so far): greedy, or drawn, with the distribution it was drawn from."""
        scores = self.processed(logits)
        if self.rng is None:
            return int(scores[0].argmax()), None
        return int(sample_rows(scores, self.rng)[0]), _probabilities(scores[0])

    def append(self, token: int) -> None:
        self.history.append(np.array([token], np.int64))


class DraftLength:
    """How many tokens an assistant model drafts next (tokens only, never time: sampling's draws
    stay a function of the seed): ``most`` at first; after a draft accepted whole, 2 more (up to
    ``most``); after one accepted in part or not at all, one more than the accepted part."""

    def __init__(self, most: int) -> None:
        self.most, self.length = most, most

    def now(self, left: int) -> int:
        """Tokens to draft with ``left`` still to produce (the step gives one more)."""
        return min(self.length, left - 1)

    def update(self, drafted: int, accepted: int) -> None:
        self.length = min(self.most, self.length + 2 if accepted == drafted else accepted + 1)


class LookupDrafter:
    """Prompt lookup's drafts: from the text so far, as long as the match allows
    (:func:`prompt_lookup`); nothing to keep in step."""

    def __init__(self, options: GenerationConfig, eos_ids: list[int]) -> None:
        self.ngram, self.eos_ids = options.max_matching_ngram_size, eos_ids
        self.most = options.prompt_lookup_num_tokens

    def propose(self, chooser: _Chooser, produced: int, left: int) -> tuple[np.ndarray, list | None]:
        return prompt_lookup(chooser.ids(), self.ngram, min(self.most, left - 1), self.eos_ids), None

    def settle(self, accepted: int, drafted: int) -> None:  # the next draft reads the text as it is
        pass


class AssistantDrafter:
    """An assistant model's drafts: its stepper runs the tokens chosen since it last ran (one
    step), then one step per drafted token but the last; the drafts rejected are then dropped
    from its cache."""

    def __init__(self, stepper, options: GenerationConfig) -> None:
        self.stepper, self.length = stepper, DraftLength(options.num_assistant_tokens)
        self.fed = 0  # chosen tokens in the assistant's cache (after the prompt)
        self.first = True

    def propose(self, chooser: _Chooser, produced: int, left: int) -> tuple[np.ndarray, list | None]:
        count = self.length.now(left)
        if count < 1:
            return np.zeros(0, np.int64), None
        chosen = chooser.history.ids[0, chooser.history.length - (produced - self.fed):chooser.history.length]
        if self.first:
            self.stepper.first()  # the prompt (the model chose the first token itself)
            self.first = False
        logits = (self.stepper.verify(chosen)[-1] if len(chosen) > 1
                  else self.stepper.next(chosen, None)[0])
        self.fed = produced
        drawn = []  # (token, the distribution it was drawn from)
        for i in range(count):
            drawn.append(chooser.draw(logits))
            if i + 1 < count:  # the last draft's logits are not needed
                logits = self.stepper.next(np.array([drawn[-1][0]], np.int64), None)[0]
        drafts, qs = zip(*drawn, strict=True)
        return np.array(drafts, np.int64), (None if chooser.rng is None else list(qs))

    def settle(self, accepted: int, drafted: int) -> None:
        """``accepted`` of ``drafted`` tokens stood: the others leave the assistant's cache."""
        self.length.update(drafted, accepted)
        cached, kept = drafted - 1, min(accepted, drafted - 1)  # the last draft never ran
        if cached > kept:
            self.stepper.drop(cached - kept)
        self.fed += kept


def speculative_tokens(stepper, call, options: GenerationConfig,
                       pipeline: Pipeline) -> Iterator[np.ndarray]:
    """Greedy search or sampling of one row with drafts (prompt lookup, or ``call``'s
    assistant); yields (1,) int64 per token, as
    :func:`~transformer_kit.core.decoding.search.stream_tokens` does."""
    check_speculative(stepper, call, options)
    if options.max_new_tokens == 0:
        return
    chooser, eos = _Chooser(call, options, pipeline), frozenset(call.eos_ids)
    drafter = (AssistantDrafter(call.assistant, options) if call.assistant is not None
               else LookupDrafter(options, call.eos_ids))
    new: list[np.ndarray] = []
    logits, drafts, qs = stepper.first(), np.zeros(0, np.int64), None
    while True:
        for j, row in enumerate(logits):
            drafted = int(drafts[j]) if j < len(drafts) else None
            token = chooser.choose(row, drafted, qs[j] if qs is not None and drafted is not None else None)
            new.append(np.array([token], np.int64))
            yield new[-1]
            ended = stopped(call, options, new[-1], eos, new)
            if len(new) == options.max_new_tokens or (ended is not None and ended[0]):
                return
            chooser.append(token)
            if drafted is not None and token != drafted:
                stepper.drop(len(drafts) - j)  # the rejected draft and every one after it
                break
        if len(drafts):
            drafter.settle(j, len(drafts))
        drafts, qs = drafter.propose(chooser, len(new), options.max_new_tokens - len(new))
        last = new[-1]
        logits = (stepper.verify(np.concatenate([last, drafts])) if len(drafts)
                  else stepper.next(last, None))
