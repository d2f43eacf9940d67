"""Prompt lookup in the engine: a request that asks for it (``prompt_lookup_num_tokens``)
and decodes alone drafts tokens from its prompt and its output so far, and one step of the
batch checks them all (speculative decoding, as ``OnnxModel.generate`` runs it:
:mod:`transformer_kit.core.decoding.speculative`).

Decided: drafts are checked only while the request is the batch's only row and nobody waits.
With other rows, a step checking one row's drafts would run every row over the draft's width
and hold the others' tokens back; a batch already uses the cores that drafting saves. So
speculation is off as soon as the batch holds two requests, and on again when one is left.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from transformer_kit.core.decoding import GenerationConfig
from transformer_kit.core.decoding.speculative import prompt_lookup
from transformer_kit.core.errors import InputError
from transformer_kit.runtime.cache_layout import CacheLayout
from transformer_kit.runtime.stats import EngineStats

if TYPE_CHECKING:
    from transformer_kit.runtime.requests import Row


class Drafting:
    """One request's prompt lookup: at most ``most`` drafted tokens, as long as the match allows."""

    def __init__(self, most: int, ngram: int, eos_ids: list[int]) -> None:
        self.most, self.ngram, self.eos_ids = most, ngram, eos_ids

    def draft(self, row: Row) -> np.ndarray:
        """The drafted ids (k,) after the row's text so far (k may be 0)."""
        request = row.request
        count = min(self.most, request.options.max_new_tokens - len(request.tokens) - 1)  # the
        if count < 1:  # step gives one more
            return np.zeros(0, np.int64)
        ids = np.concatenate([request.prompt, np.asarray(request.tokens, np.int64)])
        return prompt_lookup(ids, self.ngram, count, self.eos_ids)


#: The most drafted tokens a request (or a server's default) may ask for.
MOST_DRAFTED = 64


def default_lookup(count: int | None, batch: CacheLayout) -> int | None:
    """An engine's prompt lookup for requests that set none: ``count`` checked (1..64, and an
    export whose step checks drafts); None stays None."""
    if count is None:
        return None
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MOST_DRAFTED:
        raise InputError(f"prompt_lookup_num_tokens for every request must be 1..{MOST_DRAFTED} "
                         f"drafted tokens, got {count!r}; leave it out to draft only for requests "
                         "that ask.")
    if not batch.verifies:
        raise InputError(_OLD_EXPORT)
    return count


_OLD_EXPORT = ("prompt_lookup_num_tokens needs an export whose step gives several positions' logits "
               "(made by this version of transformer-kit): export the model again, or leave the "
               "option out.")


def drafting_for(options: GenerationConfig, eos_ids: list[int], batch: CacheLayout) -> Drafting | None:
    """A request's prompt lookup, when its options ask for it; an InputError for an export
    whose step cannot check drafts."""
    if options.prompt_lookup_num_tokens is None:
        return None
    if not batch.verifies:
        raise InputError(_OLD_EXPORT)
    return Drafting(options.prompt_lookup_num_tokens, options.max_matching_ngram_size, eos_ids)


def speculative_step(batch: CacheLayout, row: Row, drafts: np.ndarray, stats: EngineStats) -> bool:
    """Check ``drafts`` (k,) after the row's last token in one step of ``batch`` (its only row):
    each token chosen as plain decoding chooses it and streamed, the first drafted token that
    differs ending the check and the rejected drafts dropped from the cache. Counts the step,
    its tokens, the drafted and the accepted ones in the engine's ``stats``; whether the request
    ended."""
    before = len(row.request.tokens)
    logits = batch.verify(np.concatenate([[row.last], drafts]).astype(np.int64))
    ended, accepted = False, 0
    for j, position in enumerate(logits):
        drafted = int(drafts[j]) if j < len(drafts) else None
        ended = row.advance(position, drafted)
        accepted += drafted is not None and row.last == drafted
        if ended:
            break
        if drafted is not None and row.last != drafted:
            batch.drop(len(drafts) - j)
            break
    stats.steps += 1
    stats.generated_tokens += len(row.request.tokens) - before
    stats.drafted_tokens += len(drafts)
    stats.accepted_tokens += accepted
    stats.batched(1)
    return ended
