"""Cache layouts: the rows decoded together in a step graph, and where their keys and values sit.

A :class:`CacheLayout` is a running batch: prompts are prefilled into rows, rows join it, each
step appends one token per row, rows leave, reorder (beam search) and drop drafted tokens
(speculative decoding), and a prompt's cache can seed a later prompt (the prefix cache). The
strategies (``generate``'s search through :class:`~transformer_kit.runtime.stepper.LayoutStepper`,
the server's engine) see only this interface; each layout decides the rest:

- :class:`~transformer_kit.runtime.left_padded.LeftPadded`: every row's cache ends at the batch's
  last column, padding on the left, an attention mask says which columns are real; each step's
  graph writes a new cache of past + 1 columns (``decoder_step``).
- :class:`~transformer_kit.runtime.left_padded.Aligned`: the same, batch invariant: each row's
  columns keep their remainder modulo 16 as when it runs alone.
- :class:`~transformer_kit.runtime.shared_buffer.SharedBuffer`: one preallocated buffer per cache
  tensor, read and written in place by the step (``decoder_step_shared``); each row's tokens at
  its first columns, so a row computes what it computes alone.

:func:`~transformer_kit.runtime.onnx_model.OnnxModel` chooses one per model and provider
(docs/export.md, "Cache layouts").
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import numpy as np

from transformer_kit.core.errors import InputError
from transformer_kit.runtime.cache_ops import CacheOps
from transformer_kit.runtime.step_graph import StepGraph


class CacheLayout(ABC):
    """The rows decoded together in ``graph`` under one layout of their cache.

    Args:
        graph: the step graph the rows run in.
        adapter: a LoRA adapter's inputs, bound once: every row decodes with it.
        fewest_rows: a run of one token of one row runs as that many copies of it (where the
            CPU multiplies one row by a kernel of its own: :func:`one_row_exact`).

    A prefill returns the rows it made (an object of the layout's own, ``Prefilled``) with their
    next-token logits; they decode once they :meth:`join`.
    """

    #: The tokens a prompt's prefill runs in (a prefix cache's hit reuses a multiple of them,
    #: so that a prompt continuing a cached prefix computes what it computes from scratch).
    prefill_chunk: int = 1
    #: The fewest tokens a prompt continuing a cached prefix computes (its last among them).
    prefix_room: int = 1

    def __init__(self, graph: StepGraph, adapter: dict[str, Any] | None = None, fewest_rows: int = 1) -> None:
        self.graph, self.fewest_rows = graph, fewest_rows
        self.binding = graph.bind(adapter)
        #: Whether a step gives several positions' logits (drafts checked in one step).
        self.verifies = graph.verifies
        self._logits_store = np.empty((0, graph.vocab), graph.dtype)  # the most rows asked for yet
        self._logits = self._logits_store  # the view the last run's logits were asked for

    @property
    @abstractmethod
    def rows(self) -> int:
        """Rows in the batch."""

    @property
    def cache_ops(self) -> CacheOps:
        """Moves rows and columns of cache values on the graph's device."""
        return self.graph.cache_ops

    @property
    def pads_prompts(self) -> bool:
        """Whether prompts of different lengths may be prefilled in one run (left-padded);
        else only prompts of one length run together."""
        return False

    @property
    def can_join(self) -> bool:
        """Whether prefilled rows may join now."""
        return True

    @abstractmethod
    def cache_bytes(self, rows: int, columns: int) -> int:
        """The most bytes the layout holds for ``rows`` rows of at most ``columns`` columns each
        (what a bound on the cache's memory admits rows by)."""

    #: The most columns a row is expected to take (the longest prompt + max_new_tokens of the
    #: rows admitted): a layout that allocates ahead allocates no further (None: unbounded).
    columns_bound: int | None = None

    @property
    @abstractmethod
    def length(self) -> int:
        """The cache columns the rows hold now (the longest row's and its padding)."""

    #: Columns of rejected drafts the cache still holds (masked out until compacted).
    dropped: int = 0

    @property
    @abstractmethod
    def nbytes(self) -> int:
        """Bytes the batch's cache holds now."""

    def prompt_groups(self, lengths: np.ndarray) -> list[np.ndarray]:
        """How ``generate`` prefills prompts of ``lengths`` (rows,): the row indices of each
        group run together (here: those of one length, without padding)."""
        return [np.flatnonzero(lengths == n) for n in sorted(set(lengths.tolist()))]

    @abstractmethod
    def prefill(self, prompts: list[np.ndarray], past: Any = None,
                past_length: int = 0) -> tuple[Any, np.ndarray]:
        """Run prompts (each (length,) int64) after ``past`` (a prefix every row continues, as
        :meth:`prefix_past` makes it, ``past_length`` tokens; None: from scratch): the rows
        made and their next-token logits (len(prompts), vocab)."""

    @abstractmethod
    def join(self, prefilled: Any) -> None:
        """Add prefilled rows after the others."""

    @abstractmethod
    def step(self, tokens: np.ndarray) -> np.ndarray:
        """Append one token per row (rows,) int64; next-token logits (rows, vocab)."""

    @abstractmethod
    def verify(self, tokens: np.ndarray) -> np.ndarray:
        """Append ``tokens`` (n,) int64 to the batch's one row in one step (a drafted
        continuation to check): logits (n, vocab), row j the next-token logits after
        ``tokens[j]``."""

    @abstractmethod
    def drop(self, count: int) -> None:
        """Forget the one row's last ``count`` tokens (rejected drafts)."""

    @abstractmethod
    def keep(self, rows: np.ndarray) -> None:
        """Keep only ``rows`` (distinct indices, in their new order): the others leave."""

    @abstractmethod
    def reorder(self, rows: np.ndarray) -> None:
        """Each row continues row ``rows[i]`` (indices, repeats allowed: beams, samples)."""

    @abstractmethod
    def select(self, prefilled: Any, rows: np.ndarray) -> Any:
        """``rows`` (indices, in their order) of prefilled rows that have not joined."""

    @abstractmethod
    def prefix_entry(self, prefilled: Any, row: int) -> tuple[Any, int]:
        """Row ``row`` of prefilled rows as a prefix cache's entry: its prompt's cache (every
        column real, in order) and its bytes."""

    @abstractmethod
    def prefix_past(self, entry: Any, rows: int, tokens: int) -> Any:
        """The first ``tokens`` columns of an entry as the ``past`` of a prefill of ``rows``."""

    def check_verify(self) -> None:
        """Refuse :meth:`verify` unless the batch is one row of a graph that gives several
        positions' logits."""
        if self.rows != 1 or not self.verifies:
            raise InputError(f"Drafts are checked for a batch of one row of an export whose step gives "
                             f"several positions' logits; this batch has {self.rows} rows.")

    def logits_buffer(self, rows: int, positions: int = 1) -> np.ndarray:
        """A (rows x positions, vocab) array for a run's logits, the caller's until the next run:
        the same array while the shape stays (a binding's output stays bound to it), every shape
        a view of one store as large as the most rows yet (a store per batch size would hold
        tens of megabytes each under a server's changing batch)."""
        count = rows * positions
        if len(self._logits) != count:
            if len(self._logits_store) < count:
                self._logits_store = np.empty((count, self.graph.vocab), self.graph.dtype)
            self._logits = self._logits_store[:count]
        return self._logits


def prefill_in_chunks(ids: np.ndarray, past: Any, past_length: int,
                      run: Callable[[np.ndarray, Any, int], tuple[np.ndarray, Any]],
                      chunk: int | None) -> tuple[np.ndarray, Any]:
    """ids (rows, n) after ``past`` (``past_length`` real columns, a multiple of ``chunk``), run
    in chunks of ``chunk`` tokens ending at multiples of it (None: in one run); ``run(ids, past,
    done)`` -> (last position's logits, the cache after it) runs one, ``done`` tokens before it.
    Returns the last chunk's logits and the cache."""
    logits, cache, done = None, past, past_length
    step = chunk or ids.shape[1]
    for start in range(0, ids.shape[1], step):
        part = np.ascontiguousarray(ids[:, start:start + step])
        logits, cache = run(part, cache, done)
        done += part.shape[1]
    return logits, cache


def one_row_exact(make: Callable[[], CacheLayout]) -> bool:
    """Whether a layout's step graph gives one token of one row the logits it gives the same
    token in a batch of two rows, bit for bit (onnxruntime runs other kernels for one row at
    ``accuracy_level=1``, and for int4 on AVX2 CPUs: docs/export.md, "Batch invariance");
    ``make()`` makes an empty layout that runs rows as they are."""
    token = np.ones(1, np.int64)
    alone = make().prefill([token])[1][0].copy()
    pair = make().prefill([token, token])[1][0]
    return bool(np.array_equal(alone, pair))
