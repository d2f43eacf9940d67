"""A running batch for continuous batching: rows join after their own prefill and leave when
they finish, between steps of the decoder step graph.

The batch keeps the graph's layout: every row's cache is left-padded to the batch's length and
an attention mask (1 = real token) says which columns are real, so positions (counted from the
mask) stay exact and a row's tokens are computed as if it ran alone. Columns that are padding in
every row (after the longest row left) are trimmed, so the batch is as long as its longest row.

With an ``alignment`` > 1 (``onnx_steps.ALIGNMENT``, the default of ``OnnxModel``) a row keeps
its columns' remainder modulo it, as when it runs alone: a prompt's cache is followed by masked
columns up to a multiple of it, rows join only when the batch's length is a multiple of it
(``can_join``) and leading columns are trimmed by multiples of it. The engine prefills prompts of
one length together (no padding), so a row's tokens are those it gets alone, bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import onnxruntime as ort

from transformer_kit.core.errors import InputError
from transformer_kit.runtime.cache_ops import CacheOps
from transformer_kit.runtime.onnx_steps import (
    LAST_POSITION,
    LOGIT_POSITIONS,
    PREFILL_CHUNK,
    Binding,
    aligned,
    bind_adapter,
    prefill_in_chunks,
    run_step,
)


@dataclass
class PrefilledRows:
    """Prompts after their prefill, left-padded to the longest: their cache (one value per
    ``past_key_values.*`` input, (rows, kv_heads, length, head_dim)) and mask (rows, length),
    1 = real token."""

    cache: list[Any]
    mask: np.ndarray


class BatchDecoder:
    """The rows being decoded together in a decoder's step graph.

    Args:
        session: the ``decoder_step`` session; graph: its manifest entry (inputs, outputs).
        empty_cache: ``rows -> OrtValue`` of a zero-length past; vocab: logits' width;
        logits_dtype: numpy dtype of the logits; cache_ops: moves cache rows and columns;
        alignment: the columns a row keeps its remainder modulo (1: none; the module says);
        fewest_rows: a lone row's token runs as that many copies (``onnx_steps.run_step``);
        chunk: the tokens an aligned prompt is prefilled in (None: one run).
    """

    def __init__(self, session: ort.InferenceSession, graph: Any, empty_cache, vocab: int,
                 logits_dtype: type, cache_ops: CacheOps, device: str,
                 adapter: dict[str, Any] | None = None, alignment: int = 1, fewest_rows: int = 1,
                 chunk: int | None = PREFILL_CHUNK) -> None:
        self.alignment, self.fewest_rows, self.chunk = alignment, fewest_rows, chunk
        self.past_names = [n for n in graph.inputs if n.startswith("past_key_values.")]
        self.present_names = [n for n in graph.outputs if n.startswith("present.")]
        self.empty_cache, self.vocab, self.logits_dtype = empty_cache, vocab, logits_dtype
        self.cache_ops = cache_ops
        self.binding = Binding(session, device)
        #: A LoRA adapter's inputs, bound once: every row of this batch decodes with it.
        self.adapter = bind_adapter(self.binding, adapter)
        #: Whether the step gives several positions' logits (exports before it do not).
        self.verifies = LOGIT_POSITIONS in graph.inputs
        if self.verifies:  # the last position's logits (a bind lasts)
            self.binding.input_array(LOGIT_POSITIONS, LAST_POSITION)
        self.cache: list[Any] = []
        self.dropped = 0  # columns of rejected drafts masked out since the last compaction
        self.mask = np.zeros((0, 0), np.int64)  # (rows, length) 1 = real token

    @property
    def rows(self) -> int:
        return len(self.mask)

    def _run(self, ids: np.ndarray, mask: np.ndarray, cache: list[Any],
             positions: np.ndarray | None = None) -> tuple[np.ndarray, list[Any]]:
        """Logits (rows x len(positions), vocab) of ``positions`` (None: the last) and the
        present cache."""
        logits = np.empty((len(ids) * (1 if positions is None else len(positions)), self.vocab),
                          self.logits_dtype)
        if positions is not None:
            self.binding.input_array(LOGIT_POSITIONS, positions)
        present = run_step(self.binding, ids, mask, self.past_names, cache, self.present_names, logits,
                           self.cache_ops, self.fewest_rows)
        if positions is not None:
            self.binding.input_array(LOGIT_POSITIONS, LAST_POSITION)
        return logits, present

    def prefill(self, prompts: list[np.ndarray], past: list[Any] | None = None,
                past_length: int = 0) -> tuple[PrefilledRows, np.ndarray]:
        """Run prompts (each (length,) int64) together, left-padded to the longest: their rows
        and next-token logits (len(prompts), vocab). ``past``: a cache that every row continues
        (one value per ``past_key_values.*`` input, (len(prompts), kv_heads, past_length,
        head_dim), every column real: a cached prefix), the prompts being what follows it; the
        rows' mask is then (rows, past_length + longest), padding between past and prompt. With
        an alignment, prompts of one length run in chunks (``onnx_steps.prefill_in_chunks``) as
        they run alone, and masked columns follow up to a multiple of it."""
        if past is None:
            past = [self.empty_cache(len(prompts))] * len(self.past_names)
        one_length = len({len(ids) for ids in prompts}) == 1
        if self.alignment > 1 and one_length and not past_length % self.prefill_chunk:
            logits, present = prefill_in_chunks(np.stack(prompts), past, past_length, self._run, self.chunk)
            return self._aligned(PrefilledRows(present, np.ones((len(prompts), past_length + len(prompts[0])),
                                                                np.int64))), logits
        longest = max(len(ids) for ids in prompts)
        ids = np.zeros((len(prompts), longest), np.int64)
        mask = np.zeros((len(prompts), past_length + longest), np.int64)
        mask[:, :past_length] = 1
        for i, prompt in enumerate(prompts):
            ids[i, longest - len(prompt):] = prompt
            mask[i, past_length + longest - len(prompt):] = 1
        logits, present = self._run(ids, mask, past)
        return self._aligned(PrefilledRows(present, mask)), logits

    def _aligned(self, rows: PrefilledRows) -> PrefilledRows:
        """``rows`` followed by masked columns up to a multiple of the alignment."""
        gap = aligned(rows.mask.shape[1], self.alignment) - rows.mask.shape[1]
        if not gap:
            return rows
        return PrefilledRows(self.cache_ops.pad(rows.cache, 0, gap),
                             np.concatenate([rows.mask, np.zeros((len(rows.mask), gap), np.int64)], axis=1))

    @property
    def prefill_chunk(self) -> int:
        """The tokens a prompt is prefilled in (a prefix cache's hits reuse whole chunks): 1
        (any split) without an alignment or when a prompt runs whole."""
        return (self.chunk or 1) if self.alignment > 1 else 1

    @property
    def can_join(self) -> bool:
        """Whether rows may join now: the batch is empty or its length a multiple of the
        alignment (prefilled rows' lengths are)."""
        return self.rows == 0 or self.mask.shape[1] % self.alignment == 0

    def join(self, rows: PrefilledRows) -> None:
        """Add prefilled rows after the others in one copy (left-padding the shorter side)."""
        if self.rows == 0:
            self.cache, self.mask = rows.cache, rows.mask
            return
        length = max(self.mask.shape[1], rows.mask.shape[1])
        self.cache = self.cache_ops.join(self.cache, rows.cache, length - self.mask.shape[1],
                                         length - rows.mask.shape[1])
        mask = np.zeros((self.rows + len(rows.mask), length), np.int64)
        mask[:self.rows, length - self.mask.shape[1]:] = self.mask
        mask[self.rows:, length - rows.mask.shape[1]:] = rows.mask
        self.mask = mask

    def step(self, tokens: np.ndarray) -> np.ndarray:
        """Append one token per row (rows,) int64; next-token logits (rows, vocab)."""
        mask = np.concatenate([self.mask, np.ones((self.rows, 1), np.int64)], axis=1)
        logits, self.cache = self._run(tokens[:, None], mask, self.cache)
        self.mask = mask
        return logits

    def verify(self, tokens: np.ndarray) -> np.ndarray:
        """Append ``tokens`` (n,) int64 to the batch's one row in one step (a drafted
        continuation to check): logits (n, vocab), row j the next-token logits after
        ``tokens[j]``."""
        if self.rows != 1 or not self.verifies:
            raise InputError(f"Drafts are checked for a batch of one row of an export whose step gives "
                             f"several positions' logits; this batch has {self.rows} rows.")
        mask = np.concatenate([self.mask, np.ones((1, len(tokens)), np.int64)], axis=1)
        logits, self.cache = self._run(tokens[None], mask, self.cache, np.arange(len(tokens)))
        self.mask = mask
        return logits

    def drop(self, count: int) -> None:
        """Forget the one row's last ``count`` tokens (rejected drafts): their columns are masked
        out, and the cache is compacted once dropped columns are a quarter of it (at least 64)."""
        self.mask[:, self.mask.shape[1] - count:] = 0
        self.dropped += count
        if self.dropped >= max(64, self.mask.shape[1] // 4):
            kept = np.flatnonzero(self.mask[0])
            self.cache = self.cache_ops.take(self.cache, np.zeros(1, np.int64), kept)
            self.mask = np.ones((1, len(kept)), np.int64)
            self.dropped = 0

    def keep(self, rows: np.ndarray) -> None:
        """Keep only ``rows`` (indices, in their new order) and trim columns that became
        padding in every row."""
        if len(rows) == 0:
            self.cache, self.mask, self.dropped = [], np.zeros((0, 0), np.int64), 0
            return
        kept = self.select(PrefilledRows(self.cache, self.mask), rows)
        self.cache, self.mask = kept.cache, kept.mask

    def select(self, block: PrefilledRows, rows: np.ndarray) -> PrefilledRows:
        """``rows`` (indices, in their order) of a block of rows, without the columns that are
        padding in all of them."""
        rows = np.asarray(rows, dtype=np.int64)
        cache, mask = self.cache_ops.gather(block.cache, rows), block.mask[rows]
        start = int(mask.any(axis=0).argmax())
        start -= start % self.alignment
        if start:
            cache = self.cache_ops.trim(cache, start)
            mask = np.ascontiguousarray(mask[:, start:])
        return PrefilledRows(cache, mask)
