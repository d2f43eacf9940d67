"""One cache buffer shared by past and present: the step graph (``decoder_step_shared``) reads
each layer's keys and values from a preallocated buffer and writes its new columns into it in
place, so a step copies nothing and costs what the rows' own lengths cost.

Each cache tensor is one numpy array (row slots, kv_heads, width, head_dim) that onnxruntime
reads and writes through values over it (on the CPU a value shares the array's memory). A row's
tokens sit at its slot's first columns, the step told each row's length (``seqlens_k``) and the
longest (``total_sequence_length``); onnxruntime's ``GroupQueryAttention`` attends over a row's
own columns alone, so a row computes what it computes alone whatever else the batch holds: the
layout is batch invariant without padding or alignment. The buffer grows (its width doubling)
when a row outgrows it; rows that leave are compacted by copying their columns.

onnxruntime runs a step of several tokens after a cache (a prompt continuing a cached prefix,
drafts checked at once) for one row at a time, so such prefills run row by row, and so do long
prompts: in chunks of :data:`PREFILL_CHUNK` tokens, whose attention scores (heads x chunk x
length) stay small where a whole prompt's would grow with its square.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import onnxruntime as ort

from transformer_kit.runtime.cache_layout import CacheLayout
from transformer_kit.runtime.step_graph import LAST_POSITION, StepGraph

#: A buffer's width grows in multiples of this many columns.
WIDTH_STEP = 64
#: A prompt longer than this runs in chunks of this many tokens (none of one token: a last
#: token left alone joins the chunk before it).
PREFILL_CHUNK = 256


@dataclass
class BufferRows:
    """Prefilled rows: one array per cache tensor, (rows, kv_heads, width, head_dim), each
    row's tokens at its first ``lengths[row]`` columns."""

    buffers: list[np.ndarray]
    lengths: np.ndarray


def _width(columns: int) -> int:
    return max(WIDTH_STEP, -(-columns // WIDTH_STEP) * WIDTH_STEP)


class SharedBuffer(CacheLayout):
    """The rows of a batch in one buffer per cache tensor (the module says how).

    A prompt runs whole; one continuing a cached prefix computes at least 2 tokens
    (:attr:`prefix_room`): onnxruntime multiplies a run of one token by other kernels than a run
    of several, so a one-token suffix would not compute what the same token computes inside a
    whole prefill, while runs of 2 tokens or more do.

    ``fewest_rows`` 2 (a CPU that multiplies one row by a kernel of its own): a lone row runs
    with a mirror of itself in the next slot, which every step writes alike, so the mirror is
    copied once, when the row comes to be alone, not every step.
    """

    prefix_room = 2

    def __init__(self, graph: StepGraph, adapter: dict[str, Any] | None = None, fewest_rows: int = 1) -> None:
        super().__init__(graph, adapter, fewest_rows)
        self.lengths = np.zeros(0, np.int64)
        self.buffers: list[np.ndarray] = []
        self._values: tuple[int, list[Any]] | None = None  # (rows, values over buffers[:rows])

    @property
    def rows(self) -> int:
        return len(self.lengths)

    @property
    def length(self) -> int:
        return int(self.lengths.max()) if self.rows else 0

    @property
    def nbytes(self) -> int:
        return sum(buffer.nbytes for buffer in self.buffers)

    def cache_bytes(self, rows: int, columns: int) -> int:
        return rows * _width(columns) * self.graph.token_bytes

    # -- running the graph ------------------------------------------------------------------
    def _run(self, buffers: list[np.ndarray], ids: np.ndarray, lengths: np.ndarray,
             positions: np.ndarray | None = None, fresh: bool = False) -> np.ndarray:
        """One run over rows ``buffers[i][:len(ids)]``: ids (rows, new) after each row's
        ``lengths - new`` cached tokens; the logits of ``positions`` (None: the last)."""
        values = self._shared(buffers, len(ids))
        self.binding.share(values)
        if self.graph.verifies:
            self.binding.logit_positions(LAST_POSITION if positions is None else positions)
        shape = (len(ids), 1 if positions is None else len(positions))
        logits = (np.empty((shape[0] * shape[1], self.graph.vocab), self.graph.dtype) if fresh
                  else self.logits_buffer(*shape))
        feeds = {"seqlens_k": (lengths - 1).astype(np.int32),
                 "total_sequence_length": np.array(lengths.max(), np.int32)}
        self.binding.run(np.ascontiguousarray(ids, dtype=np.int64), feeds, logits)
        return logits

    def _shared(self, buffers: list[np.ndarray], rows: int) -> list[Any]:
        """Values over the first ``rows`` slots of ``buffers`` (the batch's made once per size)."""
        if buffers is not self.buffers:
            return [ort.OrtValue.ortvalue_from_numpy(b[:rows]) for b in buffers]
        if self._values is None or self._values[0] != rows:
            self._values = (rows, [ort.OrtValue.ortvalue_from_numpy(b[:rows]) for b in buffers])
        return self._values[1]

    def _new_buffers(self, rows: int, width: int) -> list[np.ndarray]:
        """Zeroed buffers (rows, kv_heads, width, head_dim), one per cache input, as views of one
        allocation: a large one is mapped and unmapped whole, so the memory of a buffer that grew
        goes back to the system instead of staying in the allocator's heaps."""
        shape = (len(self.graph.past_names), rows, self.graph.kv_heads, width, self.graph.head_dim)
        return list(np.zeros(shape, self.graph.dtype))

    def _fit(self, rows: int, columns: int) -> None:
        """Room for ``rows`` slots of ``columns`` columns each (the held rows' columns kept): the
        width doubles, up to :attr:`columns_bound` where it is set; the slots grow to what is
        asked (rows join a few at a time, and each slot costs a whole width)."""
        shape = self.buffers[0].shape if self.buffers else (0, 0, 0, 0)
        have_rows, have_width = shape[0], shape[2]
        if rows <= have_rows and columns <= have_width:
            return
        new_rows = max(rows, have_rows, 1)
        width = max(columns, 2 * have_width if columns > have_width else have_width)
        if self.columns_bound is not None:
            width = max(columns, min(width, self.columns_bound))
        width = _width(width)
        grown = self._new_buffers(new_rows, width)
        used, longest = min(max(self.rows, self.fewest_rows), have_rows), self.length  # a mirror too
        for old, new in zip(self.buffers, grown, strict=False):  # none held before the first
            new[:used, :, :longest] = old[:used, :, :longest]
        self.buffers, self._values = grown, None

    def _run_rows(self, tokens: int) -> int:
        """The slots a run of ``tokens`` new tokens for the batch's rows runs (the mirror's)."""
        return self.fewest_rows if self.rows * tokens < self.fewest_rows else self.rows

    def _mirror(self) -> None:
        """A lone row's mirror slot holds its columns (before it runs alone)."""
        if self.rows == 1 and self.fewest_rows > 1:
            self._fit(self.fewest_rows, self.length)
            for buffer in self.buffers:
                buffer[1:self.fewest_rows, :, :self.length] = buffer[:1, :, :self.length]

    # -- the layout's operations -------------------------------------------------------------
    def prefill(self, prompts: list[np.ndarray], past: BufferRows | None = None,
                past_length: int = 0) -> tuple[BufferRows, np.ndarray]:
        """Prompts of one length from scratch, up to :data:`PREFILL_CHUNK` tokens, run
        together; others each alone (onnxruntime's constraint, the module says)."""
        logits = np.empty((len(prompts), self.graph.vocab), self.graph.dtype)
        if past is None and len({len(p) for p in prompts}) == 1 and len(prompts[0]) <= PREFILL_CHUNK:
            rows, logits[:] = self._prefill_together(np.stack(prompts))
            return rows, logits
        parts = []
        for i, prompt in enumerate(prompts):
            part, logits[i] = self._prefill_row(prompt, past, past_length)
            parts.append(part)
        width = max(p.buffers[0].shape[2] for p in parts)
        buffers = self._new_buffers(len(parts), width)
        for i, part in enumerate(parts):
            for buffer, own in zip(buffers, part.buffers, strict=True):
                buffer[i, :, :own.shape[2]] = own[0]
        return BufferRows(buffers, np.concatenate([p.lengths for p in parts])), logits

    def _prefill_together(self, ids: np.ndarray) -> tuple[BufferRows, np.ndarray]:
        """ids (rows, n): each row's first tokens, in buffers of exactly n columns."""
        rows, n = ids.shape
        runs = self.fewest_rows if ids.size < self.fewest_rows else rows
        buffers = self._new_buffers(runs, n)
        logits = self._run(buffers, ids[np.arange(runs) % rows], np.full(runs, n, np.int64), fresh=True)
        return BufferRows([b[:rows] for b in buffers], np.full(rows, n, np.int64)), logits[:rows]

    def _prefill_row(self, prompt: np.ndarray, past: BufferRows | None,
                     past_length: int) -> tuple[BufferRows, np.ndarray]:
        """One prompt (n,) after the first ``past_length`` columns of ``past`` (its one row,
        None: from scratch), in chunks."""
        total = past_length + len(prompt)
        runs = self.fewest_rows if len(prompt) < self.fewest_rows else 1
        buffers = self._new_buffers(runs, total)
        if past_length:
            for buffer, cached in zip(buffers, past.buffers, strict=True):
                buffer[:, :, :past_length] = cached[:1, :, :past_length]
        done, logits = past_length, None
        while done < total:
            end = min(done + PREFILL_CHUNK, total)
            end = total if total - end == 1 else end
            piece = prompt[done - past_length:end - past_length]
            logits = self._run(buffers, np.tile(piece[None], (runs, 1)), np.full(runs, end, np.int64),
                               fresh=True)
            done = end
        return BufferRows([b[:1] for b in buffers], np.array([total], np.int64)), logits[0]

    def join(self, prefilled: BufferRows) -> None:
        start, count = self.rows, len(prefilled.lengths)
        self._fit(start + count, int(prefilled.lengths.max()) + 1)
        for buffer, rows in zip(self.buffers, prefilled.buffers, strict=True):
            width = min(rows.shape[2], buffer.shape[2])
            buffer[start:start + count, :, :width] = rows[:, :, :width]
        self.lengths = np.concatenate([self.lengths, prefilled.lengths])
        self._mirror()

    def step(self, tokens: np.ndarray) -> np.ndarray:
        runs = self._run_rows(1)
        self._fit(runs, self.length + 1)
        lengths = self.lengths + 1
        ids = tokens[np.arange(runs) % self.rows][:, None]
        logits = self._run(self.buffers, ids, lengths[np.arange(runs) % self.rows])
        self.lengths = lengths
        return logits[:self.rows]

    def verify(self, tokens: np.ndarray) -> np.ndarray:
        self.check_verify()
        runs = self._run_rows(len(tokens))
        self._fit(runs, self.length + len(tokens))
        lengths = self.lengths + len(tokens)
        logits = self._run(self.buffers, np.tile(tokens[None], (runs, 1)), np.repeat(lengths, runs),
                           np.arange(len(tokens)))
        self.lengths = lengths
        return logits[:len(tokens)]

    def drop(self, count: int) -> None:
        """The row's length shrinks: its dropped columns are written over by the next step."""
        self.lengths = self.lengths - count

    def keep(self, rows: np.ndarray) -> None:
        self.reorder(rows)

    def reorder(self, rows: np.ndarray) -> None:
        """Each slot ``i`` gets row ``rows[i]``'s columns (copied only where they move)."""
        rows = np.asarray(rows, dtype=np.int64)
        if len(rows) == 0:
            self.lengths = np.zeros(0, np.int64)
            return
        if not np.array_equal(rows, np.arange(len(rows))):
            longest = int(self.lengths[rows].max())
            self._fit(len(rows), longest)
            for buffer in self.buffers:
                buffer[:len(rows), :, :longest] = buffer[rows, :, :longest]
        self.lengths = self.lengths[rows]
        self._mirror()

    def select(self, prefilled: BufferRows, rows: np.ndarray) -> BufferRows:
        rows = np.asarray(rows, dtype=np.int64)
        return BufferRows([b[rows] for b in prefilled.buffers], prefilled.lengths[rows])

    def prefix_entry(self, prefilled: BufferRows, row: int) -> tuple[BufferRows, int]:
        """The row's columns (one row, its length wide): the prefill's buffers themselves when
        they are just that, else a copy (a view would keep every row's buffers alive, beyond the
        bytes the prefix cache counts)."""
        length = int(prefilled.lengths[row])
        if len(prefilled.lengths) == 1 and prefilled.buffers[0].shape[2] == length:
            return prefilled, length * self.graph.token_bytes
        buffers = [b[row:row + 1, :, :length].copy() for b in prefilled.buffers]
        return BufferRows(buffers, np.array([length], np.int64)), length * self.graph.token_bytes

    def prefix_past(self, entry: BufferRows, rows: int, tokens: int) -> BufferRows:
        """The entry itself (every prompt's prefill copies the columns it continues)."""
        return entry
