"""Left-padded caches: every row's keys and values end at the batch's last column, each step's
graph (``decoder_step``) writes a new cache of past + new columns.

A row's cache is left-padded to the batch's length and an attention mask (1 = real token) says
which columns are real, so positions (counted from the mask) stay exact and a row computes what
it computes alone, to the rounding of sums that start at other columns. Columns that are padding
in every row (after the longest row left) are trimmed, so the batch is as long as its longest
row. Rows are moved on the device by :class:`~transformer_kit.runtime.cache_ops.CacheOps`.

:class:`Aligned` makes the rounding the same too (batch invariance): a row keeps its columns'
remainder modulo :data:`ALIGNMENT`, as when it runs alone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from transformer_kit.runtime.cache_layout import CacheLayout, prefill_in_chunks
from transformer_kit.runtime.step_graph import LAST_POSITION, StepGraph


@dataclass
class PaddedRows:
    """Rows of a left-padded cache: one value per cache tensor, (rows, kv_heads, length,
    head_dim), and the mask (rows, length), 1 = real token; for an encoder-decoder, ``fixed``:
    the rows' encoder outputs (one value per fixed input of the step graph, rows first)."""

    cache: list[Any]
    mask: np.ndarray
    fixed: list[Any] | None = None


class LeftPadded(CacheLayout):
    """The rows of a batch left-padded to its longest (the module says how).

    ``fixed``: an encoder's outputs the step reads (encoder-decoder models, one row each), bound
    once and reordered with the rows. Rows of a running batch (a server's) bring their own:
    ``prefill(..., fixed=...)`` runs their prompts over them, and they join the batch's with the
    rows (sources of one length: a speech model's 30 s windows).
    """

    def __init__(self, graph: StepGraph, adapter: dict[str, Any] | None = None, fewest_rows: int = 1,
                 fixed: list[Any] | None = None) -> None:
        super().__init__(graph, adapter, fewest_rows)
        self.takes_mask = "attention_mask" in graph.inputs
        self.fixed = list(fixed or [])
        if self.fixed:
            self.binding.fixed(self.fixed)
        self.cache: list[Any] = []
        self.mask = np.zeros((0, 0), np.int64)  # (rows, length) 1 = real token
        self.dropped = 0  # columns of rejected drafts masked out since the last compaction

    @property
    def rows(self) -> int:
        return len(self.mask)

    @property
    def length(self) -> int:
        return self.mask.shape[1]

    @property
    def nbytes(self) -> int:
        return self.mask.size * self.graph.token_bytes

    def cache_bytes(self, rows: int, columns: int) -> int:
        """A step reads one cache and writes the next: twice the rows' columns."""
        return 2 * rows * columns * self.graph.token_bytes

    @property
    def pads_prompts(self) -> bool:
        return True

    def prompt_groups(self, lengths: np.ndarray) -> list[np.ndarray]:
        """Every prompt in one run, the shorter left-padded."""
        return [np.arange(len(lengths))]

    def run(self, ids: np.ndarray, mask: np.ndarray, past: list[Any], positions: np.ndarray | None = None,
            fresh: bool = False) -> tuple[np.ndarray, list[Any]]:
        """One run of the step graph: ids (rows, new) after ``past`` (rows, kv_heads, past,
        head_dim each), mask (rows, past + new); the logits of ``positions`` of each row (None:
        the last; a new array if ``fresh``, else the layout's buffer) and the present cache. A
        run of one token of fewer than ``fewest_rows`` rows runs as that many copies of it, so
        that it gets the numbers it gets among others."""
        if ids.size < self.fewest_rows:
            copies = np.zeros(self.fewest_rows, np.int64)
            ops = self.cache_ops
            logits, present = self._run(ids[copies], mask[copies], ops.gather(past, copies), positions, fresh)
            return logits[:len(ids)], ops.gather(present, copies[:1])
        return self._run(ids, mask, past, positions, fresh)

    def _run(self, ids: np.ndarray, mask: np.ndarray, past: list[Any], positions: np.ndarray | None,
             fresh: bool) -> tuple[np.ndarray, list[Any]]:
        binding = self.binding
        shape = (len(ids), 1 if positions is None else len(positions))
        logits = (np.empty((shape[0] * shape[1], self.graph.vocab), self.graph.dtype) if fresh
                  else self.logits_buffer(*shape))
        if self.graph.verifies:
            binding.logit_positions(LAST_POSITION if positions is None else positions)
        feeds = {"attention_mask": np.ascontiguousarray(mask)} if self.takes_mask else {}
        present = binding.run(np.ascontiguousarray(ids, dtype=np.int64), feeds, logits, past)
        return logits, present

    def prefill(self, prompts: list[np.ndarray], past: list[Any] | None = None,
                past_length: int = 0, fixed: list[Any] | None = None) -> tuple[PaddedRows, np.ndarray]:
        """Run prompts together, left-padded to the longest; with ``past`` (a cached prefix,
        every column real) the rows' mask is (rows, past_length + longest), padding between
        past and prompt. ``fixed``: the prompts' own encoder outputs (a row each), which the
        rows carry to :meth:`join` (None: the batch's bound ones)."""
        if fixed is not None:
            with self._bound(fixed):
                rows, logits = self.prefill(prompts, past, past_length)
            return PaddedRows(rows.cache, rows.mask, fixed), logits
        if past is None:
            past = self.graph.empty_cache(len(prompts))
        longest = max(len(ids) for ids in prompts)
        ids = np.zeros((len(prompts), longest), np.int64)
        mask = np.zeros((len(prompts), past_length + longest), np.int64)
        mask[:, :past_length] = 1
        for i, prompt in enumerate(prompts):
            ids[i, longest - len(prompt):] = prompt
            mask[i, past_length + longest - len(prompt):] = 1
        logits, present = self.run(ids, mask, past, fresh=True)
        return PaddedRows(present, mask), logits

    @contextlib.contextmanager
    def _bound(self, fixed: list[Any]) -> Iterator[None]:
        """``fixed`` bound for the runs inside, the batch's own again after them."""
        self.binding.fixed(fixed)
        try:
            yield
        finally:
            if self.fixed:
                self.binding.fixed(self.fixed)

    def join(self, prefilled: PaddedRows) -> None:
        """Add prefilled rows after the others in one copy (left-padding the shorter side)."""
        if prefilled.fixed is not None:
            self.fixed = (list(prefilled.fixed) if self.rows == 0
                          else self.cache_ops.concat(self.fixed, prefilled.fixed))
            self.binding.fixed(self.fixed)
        if self.rows == 0:
            self.cache, self.mask = prefilled.cache, prefilled.mask
            return
        length = max(self.mask.shape[1], prefilled.mask.shape[1])
        self.cache = self.cache_ops.join(self.cache, prefilled.cache, length - self.mask.shape[1],
                                               length - prefilled.mask.shape[1])
        mask = np.zeros((self.rows + len(prefilled.mask), length), np.int64)
        mask[:self.rows, length - self.mask.shape[1]:] = self.mask
        mask[self.rows:, length - prefilled.mask.shape[1]:] = prefilled.mask
        self.mask = mask

    def step(self, tokens: np.ndarray) -> np.ndarray:
        mask = np.concatenate([self.mask, np.ones((self.rows, 1), np.int64)], axis=1)
        logits, self.cache = self.run(tokens[:, None], mask, self.cache)
        self.mask = mask
        return logits

    def verify(self, tokens: np.ndarray) -> np.ndarray:
        self.check_verify()
        mask = np.concatenate([self.mask, np.ones((1, len(tokens)), np.int64)], axis=1)
        logits, self.cache = self.run(tokens[None], mask, self.cache, np.arange(len(tokens)))
        self.mask = mask
        return logits

    def drop(self, count: int) -> None:
        """The columns are masked out, and the cache is compacted once dropped columns are a
        quarter of it (at least 64)."""
        self.mask[:, self.mask.shape[1] - count:] = 0
        self.dropped += count
        if self.dropped >= max(64, self.mask.shape[1] // 4):
            kept = np.flatnonzero(self.mask[0])
            self.cache = self.cache_ops.take(self.cache, np.zeros(1, np.int64), kept)
            self.mask = np.ones((1, len(kept)), np.int64)
            self.dropped = 0

    def keep(self, rows: np.ndarray) -> None:
        """... and trims the columns that became padding in every row."""
        if len(rows) == 0:
            self.cache, self.mask, self.dropped = [], np.zeros((0, 0), np.int64), 0
            self.fixed = []  # the rows brought them; the next rows bring theirs
            return
        kept = self.select(PaddedRows(self.cache, self.mask), rows)
        self.cache, self.mask = kept.cache, kept.mask
        self._fixed_rows(rows)

    def reorder(self, rows: np.ndarray) -> None:
        """The columns stay as they are."""
        rows = np.asarray(rows, dtype=np.int64)
        self.cache = self.cache_ops.gather(self.cache, rows)
        self.mask = self.mask[rows]
        self._fixed_rows(rows)

    def _fixed_rows(self, rows: np.ndarray) -> None:
        if self.fixed:
            self.fixed = self.cache_ops.gather(self.fixed, np.asarray(rows, dtype=np.int64))
            self.binding.fixed(self.fixed)

    #: Leading columns are trimmed by multiples of this many.
    trim_granule = 1

    def select(self, prefilled: PaddedRows, rows: np.ndarray) -> PaddedRows:
        """... without the columns that are padding in all of them."""
        rows = np.asarray(rows, dtype=np.int64)
        cache, mask = self.cache_ops.gather(prefilled.cache, rows), prefilled.mask[rows]
        start = int(mask.any(axis=0).argmax())
        start -= start % self.trim_granule
        if start:
            cache = self.cache_ops.trim(cache, start)
            mask = np.ascontiguousarray(mask[:, start:])
        fixed = None if prefilled.fixed is None else self.cache_ops.gather(prefilled.fixed, rows)
        return PaddedRows(cache, mask, fixed)

    def prefix_entry(self, prefilled: PaddedRows, row: int) -> tuple[list[Any], int]:
        """One value per cache tensor, (1, kv_heads, length, head_dim): the row's real columns
        (the prefilled values themselves when they are just that)."""
        real = prefilled.mask[row] != 0
        if len(prefilled.mask) == 1 and real.all():
            values = prefilled.cache
        else:
            values = self.cache_ops.take(prefilled.cache, np.array([row], np.int64),
                                               np.flatnonzero(real))
        return values, int(real.sum()) * self.graph.token_bytes

    def prefix_past(self, entry: list[Any], rows: int, tokens: int) -> list[Any]:
        """One value per cache tensor, (rows, kv_heads, tokens, head_dim); the entry's own values
        when they are just that (a run never changes the past it reads)."""
        length = entry[0].shape()[2]
        if rows == 1 and tokens == length:
            return entry
        return self.cache_ops.take(entry, np.zeros(rows, np.int64), np.arange(tokens))


#: A row of an :class:`Aligned` layout keeps its cache columns' remainder modulo this many as
#: when it runs alone: onnxruntime's CPU attention adds a row's keys in vectorised groups
#: counted from the first column (4, 8 or 16 lanes by CPU), so a row whose columns keep their
#: remainder gets the sums it gets alone, bit for bit; 16 covers each.
ALIGNMENT = 16
#: ... and a prompt runs in chunks of this many tokens, each ending at a multiple of it (counted
#: from its first token), so that a prompt continuing a cached prefix of whole chunks computes
#: the numbers it computes from scratch.
PREFILL_CHUNK = 16
#: ... on CUDA, of this many: 16 tokens are the CPU kernels' lanes, while a GPU run costs its
#: kernels' launches more than its arithmetic at so few, so a long prompt in 16-token runs takes
#: many times what it takes whole (BENCHMARKS.md, "GPU"); these chunks still bound the attention
#: scores (heads x chunk x length) and give a cached prefix whole chunks to continue.
CUDA_PREFILL_CHUNK = 256


def aligned(length: int, alignment: int = ALIGNMENT) -> int:
    """``length`` rounded up to a multiple of ``alignment``."""
    return -(-length // alignment) * alignment


class Aligned(LeftPadded):
    """A left-padded layout whose rows decode bit for bit as alone, in a batch of any size
    (``OnnxModel(batch_invariant=True)`` on the ``decoder_step`` graph): a prompt's cache is
    followed by masked columns up to a multiple of :data:`ALIGNMENT`, rows join when the batch's
    length is a multiple of it (:attr:`can_join`; the engine streams their first token
    meanwhile), leading columns are trimmed by multiples of it, and prompts of one length run
    together in chunks (:data:`PREFILL_CHUNK`). ``chunk``: None prefills a prompt in one run
    (a mixture of experts: its experts' products change with the rows routed to them whatever
    the chunks, and each chunk would read the experts again)."""

    trim_granule = ALIGNMENT

    def __init__(self, graph: StepGraph, adapter: dict[str, Any] | None = None, fewest_rows: int = 1,
                 chunk: int | None = PREFILL_CHUNK, fixed: list[Any] | None = None) -> None:
        super().__init__(graph, adapter, fewest_rows, fixed)
        self.chunk = chunk
        self.prefill_chunk = chunk or 1

    @property
    def pads_prompts(self) -> bool:
        return False

    def prompt_groups(self, lengths: np.ndarray) -> list[np.ndarray]:
        return CacheLayout.prompt_groups(self, lengths)

    @property
    def can_join(self) -> bool:
        """The batch is empty or its length a multiple of the alignment (prefilled rows' are)."""
        return self.rows == 0 or self.mask.shape[1] % ALIGNMENT == 0

    def prefill(self, prompts: list[np.ndarray], past: list[Any] | None = None,
                past_length: int = 0, fixed: list[Any] | None = None) -> tuple[PaddedRows, np.ndarray]:
        """Prompts of one length (after a prefix of whole chunks) run in chunks as they run
        alone; others left-padded in one run. Masked columns follow up to a multiple of the
        alignment."""
        if fixed is not None:
            return super().prefill(prompts, past, past_length, fixed)
        if len({len(ids) for ids in prompts}) > 1 or past_length % self.prefill_chunk:
            rows, logits = super().prefill(prompts, past, past_length)
            return self._padded(rows), logits
        if past is None:
            past = self.graph.empty_cache(len(prompts))

        def run(part: np.ndarray, cache: list[Any], done: int) -> tuple[np.ndarray, list[Any]]:
            return self.run(part, np.ones((len(part), done + part.shape[1]), np.int64), cache, fresh=True)

        logits, present = prefill_in_chunks(np.stack(prompts), past, past_length, run, self.chunk)
        mask = np.ones((len(prompts), past_length + len(prompts[0])), np.int64)
        return self._padded(PaddedRows(present, mask)), logits

    def _padded(self, rows: PaddedRows) -> PaddedRows:
        """``rows`` followed by masked columns up to a multiple of the alignment."""
        gap = aligned(rows.mask.shape[1]) - rows.mask.shape[1]
        if not gap:
            return rows
        return PaddedRows(self.cache_ops.pad(rows.cache, 0, gap),
                          np.concatenate([rows.mask, np.zeros((len(rows.mask), gap), np.int64)], axis=1))
