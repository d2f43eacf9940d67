"""A running batch for continuous batching: rows join after their own prefill and leave when
they finish, between steps of the decoder step graph.

The batch keeps the graph's layout: every row's cache is left-padded to the batch's length and
an attention mask (1 = real token) says which columns are real, so positions (counted from the
mask) stay exact and a row's tokens are computed as if it ran alone. Columns that are padding in
every row (after the longest row left) are trimmed, so the batch is as long as its longest row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import onnxruntime as ort

from transformer_kit.export.onnx_steps import Binding, CacheOps


@dataclass
class PrefilledRow:
    """One prompt after its prefill: its cache (one value per ``past_key_values.*`` input,
    (1, kv_heads, length, head_dim)) and its length."""

    cache: list[Any]
    length: int


class BatchDecoder:
    """The rows being decoded together in a decoder's step graph.

    Args:
        session: the ``decoder_step`` session; graph: its manifest entry (inputs, outputs).
        empty_cache: ``rows -> OrtValue`` of a zero-length past; vocab: logits' width;
        logits_dtype: numpy dtype of the logits; cache_ops: moves cache rows and columns.
    """

    def __init__(self, session: ort.InferenceSession, graph: Any, empty_cache, vocab: int,
                 logits_dtype: type, cache_ops: CacheOps, device: str) -> None:
        self.past_names = [n for n in graph.inputs if n.startswith("past_key_values.")]
        self.present_names = [n for n in graph.outputs if n.startswith("present.")]
        self.empty_cache, self.vocab, self.logits_dtype = empty_cache, vocab, logits_dtype
        self.cache_ops = cache_ops
        self.binding = Binding(session, device)
        self.cache: list[Any] = []
        self.mask = np.zeros((0, 0), np.int64)  # (rows, length) 1 = real token

    @property
    def rows(self) -> int:
        return len(self.mask)

    def _run(self, ids: np.ndarray, mask: np.ndarray, cache: list[Any]) -> tuple[np.ndarray, list[Any]]:
        logits = np.empty((len(ids), self.vocab), self.logits_dtype)
        binding = self.binding.rebind()
        binding.input_array("input_ids", np.ascontiguousarray(ids, dtype=np.int64))
        binding.input_array("attention_mask", np.ascontiguousarray(mask))
        binding.input_values(self.past_names, cache)
        binding.output("logits", ort.OrtValue.ortvalue_from_numpy(logits))
        binding.outputs_on_device(self.present_names)
        return logits, binding.run(first=1)

    def prefill(self, ids: np.ndarray) -> tuple[PrefilledRow, np.ndarray]:
        """Run one prompt alone: ids (length,) int64 -> its row and next-token logits (vocab,)."""
        cache = [self.empty_cache(1)] * len(self.past_names)
        logits, present = self._run(ids[None], np.ones((1, len(ids)), np.int64), cache)
        return PrefilledRow(present, len(ids)), logits[0]

    def join(self, row: PrefilledRow) -> int:
        """Add a prefilled row after the others (left-padding the shorter side); its index."""
        if self.rows == 0:
            self.cache, self.mask = row.cache, np.ones((1, row.length), np.int64)
            return 0
        length = max(self.mask.shape[1], row.length)
        self.cache = self.cache_ops.join(self.cache, row.cache, length - self.mask.shape[1],
                                         length - row.length)
        mask = np.zeros((self.rows + 1, length), np.int64)
        mask[:-1, length - self.mask.shape[1]:] = self.mask
        mask[-1, length - row.length:] = 1
        self.mask = mask
        return self.rows - 1

    def step(self, tokens: np.ndarray) -> np.ndarray:
        """Append one token per row (rows,) int64; next-token logits (rows, vocab)."""
        mask = np.concatenate([self.mask, np.ones((self.rows, 1), np.int64)], axis=1)
        logits, self.cache = self._run(tokens[:, None], mask, self.cache)
        self.mask = mask
        return logits

    def keep(self, rows: np.ndarray) -> None:
        """Keep only ``rows`` (indices, in their new order) and trim columns that became
        padding in every row."""
        rows = np.asarray(rows, dtype=np.int64)
        if len(rows) == 0:
            self.cache, self.mask = [], np.zeros((0, 0), np.int64)
            return
        self.cache = self.cache_ops.gather(self.cache, rows)
        self.mask = self.mask[rows]
        start = int(self.mask.any(axis=0).argmax())
        if start:
            self.cache = self.cache_ops.trim(self.cache, start)
            self.mask = np.ascontiguousarray(self.mask[:, start:])
