"""``generate``'s steps in onnxruntime: the decoding strategies'
:class:`~transformer_kit.core.decoding.Stepper` over a cache layout.

The prompts run first (the layout groups them: :meth:`CacheLayout.prompt_groups`), then one
token per row; beam search and several samples per prompt reorder the rows between steps, and
speculative decoding checks drafts in one step and drops those rejected. Every step goes to the
layout (:mod:`.cache_layout`), which runs the step graph (:mod:`.step_graph`).
"""

from __future__ import annotations

import numpy as np

from transformer_kit.runtime.cache_layout import CacheLayout


class LayoutStepper:
    """The steps of one ``generate`` call: prompts ``ids`` (rows, length) int64, left-padded,
    with ``real`` (rows, length) bool, True for real tokens, run on ``layout`` (empty)."""

    def __init__(self, layout: CacheLayout, ids: np.ndarray, real: np.ndarray) -> None:
        self.layout, self.ids, self.real = layout, ids, real

    @property
    def verifies(self) -> bool:
        """Whether a step gives several positions' logits (speculative decoding checks drafts)."""
        return self.layout.verifies

    @property
    def length(self) -> int:
        """The cache columns the rows hold now."""
        return self.layout.length

    @property
    def dropped(self) -> int:
        """Columns of rejected drafts the cache still holds (masked out until compacted)."""
        return self.layout.dropped

    def first(self) -> np.ndarray:
        """Run the prompts: next-token logits (rows, vocab), in the prompts' order."""
        lengths = self.real.sum(axis=1)
        width = self.ids.shape[1]
        prompts = [self.ids[row, width - n:] for row, n in enumerate(lengths.tolist())]
        groups = self.layout.prompt_groups(lengths)
        logits = np.empty((len(prompts), self.layout.graph.vocab), self.layout.graph.dtype)
        for group in groups:
            prefilled, logits[group] = self.layout.prefill([prompts[i] for i in group])
            self.layout.join(prefilled)
        order = np.concatenate(groups)
        if not np.array_equal(order, np.arange(len(order))):
            self.layout.reorder(np.argsort(order))
        return logits

    def next(self, tokens: np.ndarray, rows: np.ndarray | None) -> np.ndarray:
        """Append ``tokens`` (n,) int64 after rows ``rows`` (None: as they are): logits (n, vocab)."""
        if rows is not None:
            self.layout.reorder(rows)
        return self.layout.step(tokens)

    def verify(self, tokens: np.ndarray) -> np.ndarray:
        """Append ``tokens`` (n,) int64 to the one row in one run: logits (n, vocab), row j the
        next-token logits after ``tokens[j]``."""
        return self.layout.verify(tokens)

    def drop(self, count: int) -> None:
        """Forget the last ``count`` tokens (rejected drafts)."""
        self.layout.drop(count)
