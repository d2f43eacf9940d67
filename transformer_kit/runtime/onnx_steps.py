"""Decoding steps in onnxruntime: the :class:`~transformer_kit.core.decoding.Stepper` of
``OnnxModel``, with the key/value cache kept in onnxruntime between steps and reordered there.

Beam search and several samples per prompt move cache rows every step. The rows are gathered by
one small ONNX graph (a ``Gather`` per cached tensor, every layer in one ``run``), so the cache
is never copied through Python or numpy, and on CUDA it stays on the device
(:mod:`.cache_ops`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import onnxruntime as ort

#: The step graph's input naming the new positions that get logits (exports before it have
#: the last position's alone); ``LAST_POSITION`` is the last.
LOGIT_POSITIONS = "logit_positions"
LAST_POSITION = np.array([-1], np.int64)


#: Whether onnxruntime exposes the native device its binding object takes.
NATIVE = hasattr(ort.OrtDevice, "_get_c_device")


class Binding:
    """One run's inputs and outputs, bound through onnxruntime's native binding object.

    onnxruntime's Python ``IOBinding`` checks every bind (pinning, the session a value came
    from) and wraps every output in a Python ``OrtValue``: about 50 us a step for a cache of 16
    tensors, 5-10 % of an int4 decoding step here. Decoding binds values this module made for
    this session, so it goes to the native object directly (``_iobinding``, ``_sess`` and
    ``_ortvalue``: private names, as in onnxruntime 1.31; where one is missing the public path
    runs instead). Values passed around are then native ``OrtValue`` objects.
    """

    def __init__(self, session: ort.InferenceSession, device: str) -> None:
        self.session = session
        self.io = session.io_binding()
        native = NATIVE and hasattr(session, "_sess")
        self.native = getattr(self.io, "_iobinding", None) if native else None
        self.device = _native_device(device) if self.native is not None else device
        self.arrays: list[np.ndarray] = []  # numpy inputs stay alive until the run

    def rebind(self) -> Binding:
        """Ready for the next run of the same session: each bind replaces the one of its name
        (binding afresh costs about 15 us a step more). Returns self."""
        self.arrays.clear()
        return self

    def input_array(self, name: str, array: np.ndarray) -> None:
        if self.native is None:
            self.io.bind_cpu_input(name, array)
        else:
            self.arrays.append(array)
            self.native.bind_input(name, array)

    def input_value(self, name: str, value: Any) -> None:
        if self.native is None:
            self.io.bind_ortvalue_input(name, value)
        else:
            self.native.bind_ortvalue_input(name, native_value(value))

    def input_values(self, names: list[str], values: list[Any]) -> None:
        """Bind each of ``values`` to the input of the same position in ``names`` (one step's
        cache: a loop without a Python call per value, about 1 us a value less when cold)."""
        if self.native is None:
            for name, value in zip(names, values, strict=True):
                self.io.bind_ortvalue_input(name, value)
            return
        bind = self.native.bind_ortvalue_input
        for name, value in zip(names, values, strict=True):
            bind(name, getattr(value, "_ortvalue", value))

    def outputs_on_device(self, names: list[str]) -> None:
        """Bind each output of ``names`` to new memory on the device, allocated by the run."""
        bind = self.io.bind_output if self.native is None else self.native.bind_output
        for name in names:
            bind(name, self.device)

    def output(self, name: str, value: Any = None) -> None:
        """Bind output ``name`` to ``value`` (an OrtValue) or to new memory on the device."""
        if self.native is None:
            if value is None:
                self.io.bind_output(name, self.device)
            else:
                self.io.bind_ortvalue_output(name, value)
        elif value is None:
            self.native.bind_output(name, self.device)
        else:
            self.native.bind_ortvalue_output(name, native_value(value))

    def run(self, first: int = 0) -> list[Any]:
        """Run the session; the outputs in graph order, from output ``first`` on."""
        if self.native is None:
            self.session.run_with_iobinding(self.io)
            return self.io.get_outputs()[first:]
        self.session._sess.run_with_iobinding(self.native, None)
        outputs = self.native.get_outputs()
        return [outputs[i] for i in range(first, len(outputs))]


#: Decoding keeps each row's tokens in cache columns of the same remainder modulo this many as
#: when the row runs alone (``OnnxModel(batch_invariant=True)``, the default): a prompt's cache
#: starts at such a column and is followed by masked columns up to the next multiple, and rows
#: join a running batch when its length is a multiple. onnxruntime's CPU attention adds a row's
#: keys in vectorised groups counted from the first column (every 4 columns with onnxruntime
#: 1.31.1 on AVX-512; 8 or 16 lanes on other CPUs), so a row whose columns keep their remainder
#: gets the sums it gets alone, bit for bit; 16 covers each.
ALIGNMENT = 16
#: ... and prefills a prompt in chunks of this many tokens, each ending at a multiple of it
#: (counted from the prompt's first token), so that a prompt continuing a cached prefix of whole
#: chunks computes the numbers it computes from scratch.
PREFILL_CHUNK = 16


def aligned(length: int, alignment: int) -> int:
    """``length`` rounded up to a multiple of ``alignment``."""
    return -(-length // alignment) * alignment


def run_step(binding: Binding, ids: np.ndarray, mask: np.ndarray, past_names: list[str],
             past: list[Any], present_names: list[str], logits: np.ndarray, cache_ops: Any = None,
             fewest_rows: int = 1) -> list[Any]:
    """One run of a decoder step graph: ids (rows, len) int64 after ``past`` (one value per
    ``past_key_values.*`` input), mask (rows, past + len) 1 = real token; the logits written
    into ``logits`` (rows, vocab); the present cache (one value per ``present.*`` output).

    Products of fewer than ``fewest_rows`` rows (one token of one row) run as that many copies
    of it (``cache_ops`` copies the cache): where a CPU multiplies one row by a kernel of its
    own (``one_row_exact``), a lone token then gets the numbers it gets among others."""
    if ids.size < fewest_rows:
        copies = np.zeros(fewest_rows, np.int64)
        more = np.empty((fewest_rows, logits.shape[1]), logits.dtype)
        present = run_step(binding, ids[copies], mask[copies], past_names, cache_ops.gather(past, copies),
                           present_names, more)
        logits[:] = more[:len(logits)]
        return cache_ops.gather(present, copies[:1])
    binding.rebind()
    binding.input_array("input_ids", np.ascontiguousarray(ids, dtype=np.int64))
    binding.input_array("attention_mask", np.ascontiguousarray(mask, dtype=np.int64))
    binding.input_values(past_names, past)
    binding.output("logits", ort.OrtValue.ortvalue_from_numpy(logits))
    binding.outputs_on_device(present_names)
    return binding.run(first=1)


def one_row_exact(session: ort.InferenceSession, graph: Any, empty_cache, vocab: int,
                  logits_dtype: type, cache_ops: Any, device: str) -> bool:
    """Whether the step graph gives one token of one row the logits it gives the same token in
    a batch of two rows, bit for bit (onnxruntime runs other kernels for one row at
    ``accuracy_level=1``, and for int4 on AVX2 CPUs: docs/export.md, "Batch invariance")."""
    past_names = [n for n in graph.inputs if n.startswith("past_key_values.")]
    present_names = [n for n in graph.outputs if n.startswith("present.")]
    binding = Binding(session, device)
    if LOGIT_POSITIONS in graph.inputs:
        binding.input_array(LOGIT_POSITIONS, LAST_POSITION)
    logits = [np.empty((rows, vocab), logits_dtype) for rows in (1, 2)]
    for out in logits:
        run_step(binding, np.ones((len(out), 1), np.int64), np.ones((len(out), 1), np.int64), past_names,
                 [empty_cache(len(out))] * len(past_names), present_names, out)
    return bool(np.array_equal(logits[0][0], logits[1][0]))


def prefill_in_chunks(ids: np.ndarray, past: list[Any], past_length: int,
                      run: Callable[[np.ndarray, np.ndarray, list[Any]], tuple[np.ndarray, list[Any]]],
                      chunk: int | None = PREFILL_CHUNK) -> tuple[np.ndarray, list[Any]]:
    """ids (rows, n) after ``past`` (``past_length`` real columns, a multiple of ``chunk``), run
    in chunks of ``chunk`` tokens ending at multiples of it (None: in one run); ``run(ids, mask,
    past)`` -> (last position's logits, present) runs one. Returns the last chunk's logits and
    the cache."""
    logits, cache, done = None, past, past_length
    step = chunk or ids.shape[1]
    for start in range(0, ids.shape[1], step):
        part = ids[:, start:start + step]
        logits, cache = run(part, np.ones((len(ids), done + part.shape[1]), np.int64), cache)
        done += part.shape[1]
    return logits, cache


def suffix_lengths(real: np.ndarray) -> np.ndarray | None:
    """Each row's count of real tokens (rows,) when every row's are one run up to the last
    column (left padding) and none is empty; else None."""
    real = real.astype(bool)
    lengths = real.sum(axis=1)
    columns = np.arange(real.shape[1])
    if not lengths.all() or not (real == (columns >= real.shape[1] - lengths[:, None])).all():
        return None
    return lengths


def native_value(value: Any) -> Any:
    """The native OrtValue behind onnxruntime's Python ``OrtValue`` (itself when native)."""
    return getattr(value, "_ortvalue", value)


@functools.cache
def _native_device(device: str) -> Any:
    return ort.OrtDevice.make(device, 0)._get_c_device()


def bind_adapter(binding: Binding, adapter: dict[str, Any] | None) -> dict[str, Any]:
    """Bind a LoRA adapter's inputs (export/adapters.py: ``A``, ``B`` of each adapted product)
    that the session's graph has, once for every later run; the values bound (keep them)."""
    accepted = {i.name for i in binding.session.get_overridable_initializers()}
    values = {k: v for k, v in (adapter or {}).items() if k in accepted}
    binding.input_values(list(values), list(values.values()))
    return values


class OnnxStepper:
    """Feeds the decoder step graph: the prompt first (zero-length past), then one token per
    row, handing each step's ``present.*`` to the next as ``past_key_values.*`` without a copy.

    The attention mask lives in one buffer that doubles when full (memory grows with the tokens
    generated, not with ``max_new_tokens``) and the logits are written into one preallocated
    array per row count, so a step allocates nothing in Python besides the mask view.

    ``alignment`` > 1 (a decoder's left-padded prompts): each prompt runs without padding, with
    those of its length, in chunks (:func:`prefill_in_chunks`), its cache starting at a multiple
    of ``alignment`` and masked columns after it up to the next (:data:`ALIGNMENT`), so a row
    decodes bit for bit as alone;
    ``fewest_rows``: a lone row's token runs as that many copies (:func:`run_step`);
    ``prefill_chunk``: the tokens an aligned prompt is prefilled in (None: one run).
    """

    def __init__(self, session: ort.InferenceSession, graph: Any, fixed: dict[str, ort.OrtValue],
                 first_ids: np.ndarray, real: np.ndarray | None, empty_cache, vocab: int,
                 logits_dtype: type, cache_ops: Any, device: str,
                 adapter: dict[str, ort.OrtValue] | None = None, alignment: int = 1,
                 fewest_rows: int = 1, prefill_chunk: int | None = PREFILL_CHUNK) -> None:
        self.cache_ops, self.empty_cache, self.alignment = cache_ops, empty_cache, alignment
        self.fewest_rows, self.prefill_chunk = fewest_rows, prefill_chunk
        self.past_names = [n for n in graph.inputs if n.startswith("past_key_values.")]
        self.present_names = [n for n in graph.outputs if n.startswith("present.")]
        self.fixed_names = [k for k in fixed if k in graph.inputs]
        self.fixed_values = [fixed[k] for k in self.fixed_names]
        self.fixed_unbound = True  # the encoder's outputs, bound again only after a reorder
        rows = first_ids.shape[0]
        self.past = [empty_cache(rows)] * len(self.past_names)
        self.first_ids = first_ids
        self.length = first_ids.shape[1]
        self.mask = None
        if real is not None:
            self.mask = np.ones((rows, 2 * self.length + 8), np.int64)
            self.mask[:, :self.length] = real
        self.vocab, self.logits_dtype = vocab, logits_dtype
        self.logits: np.ndarray | None = None
        self.tokens: np.ndarray | None = None  # (rows, 1) int64, bound as input_ids by its OrtValue
        self.binding = Binding(session, device)
        #: An adapter's inputs (export/adapters.py): bound once, the same for every row and step.
        self.adapter = bind_adapter(self.binding, adapter)
        #: Whether the graph gives several positions' logits (exports before it do not).
        self.verifies = LOGIT_POSITIONS in graph.inputs
        if self.verifies:  # the last position's logits unless :meth:`verify` asks (a bind lasts)
            self.binding.input_array(LOGIT_POSITIONS, LAST_POSITION)
        self.dropped = 0  # cache columns dropped (mask 0) since the last compaction

    def first(self) -> np.ndarray:
        lengths = None
        if self.alignment > 1 and self.mask is not None:
            lengths = suffix_lengths(self.mask[:, :self.length])
        if lengths is not None:
            return self._first_aligned(lengths)
        self.binding.rebind().input_array("input_ids", self.first_ids)
        self.tokens = None  # the prompt replaced the token buffer's bind
        return self._run(len(self.first_ids))

    def _first_aligned(self, lengths: np.ndarray) -> np.ndarray:
        """Run the prompts of each length together without padding, then lay their caches out
        as the class says: next-token logits (rows, vocab)."""
        rows, alignment = len(lengths), self.alignment
        width = max(aligned(int(n), alignment) for n in lengths)
        logits = np.empty((rows, self.vocab), self.logits_dtype)
        cache, order = None, []

        def run(ids: np.ndarray, mask: np.ndarray, past: list[Any]) -> tuple[np.ndarray, list[Any]]:
            part = np.empty((len(ids), self.vocab), self.logits_dtype)
            return part, run_step(self.binding, ids, mask, self.past_names, past, self.present_names,
                                  part, self.cache_ops, self.fewest_rows)

        for n in sorted(set(lengths.tolist())):
            group = np.flatnonzero(lengths == n)
            part, present = prefill_in_chunks(self.first_ids[group, self.length - n:],
                                              [self.empty_cache(len(group))] * len(self.past_names), 0, run,
                                              self.prefill_chunk)
            logits[group] = part
            present = self.cache_ops.pad(present, width - aligned(n, alignment), aligned(n, alignment) - n)
            cache = present if cache is None else self.cache_ops.join(cache, present, 0, 0)
            order.extend(group.tolist())
        if order != list(range(rows)):
            cache = self.cache_ops.gather(cache, np.argsort(np.array(order, np.int64)))
        self.mask = np.ones((rows, 2 * width + 8), np.int64)
        self.mask[:, :width] = 0
        for row, n in enumerate(lengths.tolist()):
            start = width - aligned(n, alignment)
            self.mask[row, start:start + n] = 1
        self.past, self.length = cache, width
        self.logits = self.tokens = None  # the groups' runs replaced both binds
        return logits

    def next(self, tokens: np.ndarray, rows: np.ndarray | None) -> np.ndarray:
        if rows is not None:
            self._reorder(rows)
        self._extend(1)
        if len(tokens) < self.fewest_rows:  # one row: run as copies of it (run_step)
            logits = np.empty((len(tokens), self.vocab), self.logits_dtype)
            self.past = run_step(self.binding, tokens[:, None], self.mask[:, :self.length], self.past_names,
                                 self.past, self.present_names, logits, self.cache_ops, self.fewest_rows)
            self.logits = self.tokens = None  # the copies' run replaced both binds
            return logits
        self.binding.rebind()
        if self.tokens is None or len(self.tokens) != len(tokens):
            # onnxruntime reads the buffer when it runs: later steps only write into it
            self.tokens = np.empty((len(tokens), 1), np.int64)
            self.binding.input_value("input_ids", ort.OrtValue.ortvalue_from_numpy(self.tokens))
        self.tokens[:, 0] = tokens
        return self._run(len(tokens))

    def verify(self, tokens: np.ndarray) -> np.ndarray:
        """Append ``tokens`` (n,) int64 to the one row (a decoder's, one prompt) in one run:
        logits (n, vocab), row j the next-token logits after ``tokens[j]``."""
        self._extend(len(tokens))
        binding = self.binding.rebind()
        binding.input_array("input_ids", np.ascontiguousarray(tokens[None], dtype=np.int64))
        self.tokens = None  # input_ids now names this array
        binding.input_array(LOGIT_POSITIONS, np.arange(len(tokens), dtype=np.int64))
        logits = self._run(len(tokens))
        binding.input_array(LOGIT_POSITIONS, LAST_POSITION)
        return logits

    def drop(self, count: int) -> None:
        """Forget the last ``count`` tokens (rejected drafts): their columns are masked out, and
        the cache is compacted once dropped columns are a quarter of it (at least 64)."""
        self.mask[:, self.length - count:self.length] = 0
        self.dropped += count
        if self.dropped >= max(64, self.length // 4):
            kept = np.flatnonzero(self.mask[0, :self.length])  # masked columns count for nothing
            self.past = self.cache_ops.take(self.past, np.zeros(1, np.int64), kept)
            self.mask = np.ones((1, 2 * len(kept) + 8), np.int64)
            self.length, self.dropped = len(kept), 0

    def _extend(self, count: int) -> None:
        """``count`` more columns; the mask buffer doubles when full."""
        self.length += count
        while self.mask is not None and self.length > self.mask.shape[1]:
            grown = np.ones((len(self.mask), 2 * self.mask.shape[1]), np.int64)
            grown[:, :self.mask.shape[1]] = self.mask
            self.mask = grown

    def _reorder(self, rows: np.ndarray) -> None:
        """Every row-indexed state: cache, fixed encoder outputs and mask, gathered by ``rows``."""
        gathered = self.cache_ops.gather([*self.past, *self.fixed_values], rows)
        self.past = gathered[:len(self.past)]
        self.fixed_values = gathered[len(self.past):]
        self.fixed_unbound = True
        if self.mask is not None:
            self.mask = self.mask[rows]

    def _run(self, rows: int) -> np.ndarray:
        """Run the step graph on the bound input_ids (rows of them) and the state."""
        binding = self.binding
        if self.logits is None or len(self.logits) != rows:  # a bind lasts until replaced
            self.logits = np.empty((rows, self.vocab), self.logits_dtype)
            binding.output("logits", ort.OrtValue.ortvalue_from_numpy(self.logits))
        if self.fixed_unbound:
            binding.input_values(self.fixed_names, self.fixed_values)
            self.fixed_unbound = False
        if self.mask is not None:
            binding.input_array("attention_mask", np.ascontiguousarray(self.mask[:, :self.length]))
        binding.input_values(self.past_names, self.past)
        binding.outputs_on_device(self.present_names)
        self.past = binding.run(first=1)  # logits came into self.logits
        return self.logits
