"""The decoder step graph of an export, and one run of it.

A step graph takes new tokens after a key/value cache and gives their logits and the cache
after them. :class:`StepGraph` says what the graph is (its session, the names of its cache
inputs and outputs, the cache's shape and dtype, the device it runs on); :class:`StepBinding`
is one caller's binding of it through onnxruntime's ``IOBinding``: what stays bound between runs
(a LoRA adapter, the logit positions, an encoder's outputs, a cache buffer shared by past and
present) and a run of new tokens.

Two kinds of step graph are exported (docs/export.md, "Cache layouts"): ``decoder_step`` reads
a past and writes a new present of past + new columns (``attention_mask`` (rows, past + new),
1 = real token); ``decoder_step_shared`` reads and writes one preallocated buffer per cache
tensor in place (``seqlens_k`` (rows,) int32, each row's length after the run - 1, and
``total_sequence_length`` () int32, the longest).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnxruntime as ort

from transformer_kit.runtime.cache_ops import CacheOps
from transformer_kit.runtime.manifest import GraphInfo

#: The step graph's input naming the new positions that get logits; ``LAST_POSITION`` is the last.
LOGIT_POSITIONS = "logit_positions"
LAST_POSITION = np.array([-1], np.int64)
#: Inputs a step graph reads from an encoder's run (encoder-decoder models), bound once a call.
FIXED_PREFIXES = ("cross.", "encoder_attention_mask")


class StepGraph:
    """A decoder step graph: its session and what a run binds.

    Args:
        session: the graph's onnxruntime session.
        graph: its manifest entry (input and output names).
        vocab: the logits' width; kv_heads, head_dim: a cache tensor's (rows, kv_heads, length,
            head_dim) sizes; dtype: the numpy dtype of the logits and the cache.
        device: ``"cpu"`` or ``"cuda"``, where the cache lives; providers: the session's (the
            cache operations' small graphs run on them too).
    """

    def __init__(self, session: ort.InferenceSession, graph: GraphInfo, *, vocab: int, kv_heads: int,
                 head_dim: int, dtype: type, device: str, providers: Sequence) -> None:
        self.session, self.vocab, self.kv_heads, self.head_dim = session, vocab, kv_heads, head_dim
        self.dtype, self.device = dtype, device
        self.inputs, self.outputs = list(graph.inputs), list(graph.outputs)
        #: The cache inputs (``past_key_values.{i}.key/value``) and outputs (``present.*``), in order.
        self.past_names = [n for n in self.inputs if n.startswith("past_key_values.")]
        self.present_names = [n for n in self.outputs if n.startswith("present.")]
        #: An encoder's outputs the step reads (encoder-decoder models), in order.
        self.fixed_names = [n for n in self.inputs if n.startswith(FIXED_PREFIXES)]
        #: Whether the graph gives several positions' logits (``verify``; exports before it do not).
        self.verifies = LOGIT_POSITIONS in self.inputs
        #: Whether past and present are one buffer (``decoder_step_shared``).
        self.shares_buffer = "seqlens_k" in self.inputs
        #: Moves cache rows and columns on the device (beam reorders, rows joining a batch).
        self.cache_ops = CacheOps(providers, device)
        #: The LoRA inputs the session takes (each adapter binds those it has).
        self.adapter_inputs = {i.name for i in session.get_overridable_initializers()}

    @property
    def token_bytes(self) -> int:
        """Bytes of one token's keys and values in every layer (one row, one column)."""
        return len(self.past_names) * self.kv_heads * self.head_dim * np.dtype(self.dtype).itemsize

    def empty_cache(self, rows: int) -> list[ort.OrtValue]:
        """A zero-length past for ``rows`` rows: one value per cache input (rows, kv_heads, 0,
        head_dim), on the device."""
        empty = ort.OrtValue.ortvalue_from_shape_and_type([rows, self.kv_heads, 0, self.head_dim],
                                                          self.dtype, self.device, 0)
        return [empty] * len(self.past_names)

    def bind(self, adapter: dict[str, ort.OrtValue] | None = None) -> StepBinding:
        """A binding of this graph, with ``adapter``'s inputs (a LoRA adapter's ``A`` and ``B``
        of each adapted product) bound for every run."""
        return StepBinding(self, adapter)


class StepBinding:
    """One caller's binding of a :class:`StepGraph`: binds last until replaced, so a run binds
    only what changed since the last one (new tokens, the mask, a concatenating graph's cache).
    One caller at a time: it is not thread-safe."""

    def __init__(self, graph: StepGraph, adapter: dict[str, ort.OrtValue] | None = None) -> None:
        self.graph = graph
        self.io = graph.session.io_binding()
        #: The adapter's values bound (kept alive as long as the binding).
        self.adapter = {k: v for k, v in (adapter or {}).items() if k in graph.adapter_inputs}
        for name, value in self.adapter.items():
            self.io.bind_ortvalue_input(name, value)
        self.logits: np.ndarray | None = None  # the array "logits" is bound to
        self.arrays: dict[str, np.ndarray] = {}  # numpy inputs bound, alive until replaced
        self.shared: list[Any] | None = None  # cache buffers bound as both past and present
        self.positions: np.ndarray | None = None
        if graph.verifies:
            self.logit_positions(LAST_POSITION)

    def logit_positions(self, positions: np.ndarray) -> None:
        """The new positions whose logits a run gives (``LAST_POSITION``: the last)."""
        if self.positions is not positions:
            self.input_array(LOGIT_POSITIONS, positions)
            self.positions = positions

    def input_array(self, name: str, array: np.ndarray) -> None:
        """Bind input ``name`` to ``array``. The graph reads the array's memory when it runs
        (onnxruntime copies nothing on the CPU), so an array bound again is not bound anew: a
        caller may write a step's values into the array it bound before."""
        if self.arrays.get(name) is array:
            return
        self.arrays[name] = array
        self.io.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(array))

    def fixed(self, values: list[Any]) -> None:
        """Bind an encoder's outputs (one per ``graph.fixed_names``) for every later run."""
        for name, value in zip(self.graph.fixed_names, values, strict=True):
            self.io.bind_ortvalue_input(name, value)

    def share(self, buffers: list[Any]) -> None:
        """Bind ``buffers`` (one OrtValue per cache tensor) as both past and present of every
        later run: the graph writes its new columns into them in place."""
        if self.shared is not None and all(a is b for a, b in zip(self.shared, buffers, strict=True)):
            return
        for past, present, value in zip(self.graph.past_names, self.graph.present_names, buffers,
                                        strict=True):
            self.io.bind_ortvalue_input(past, value)
            self.io.bind_ortvalue_output(present, value)
        self.shared = list(buffers)

    def run(self, ids: np.ndarray, feeds: dict[str, np.ndarray], logits: np.ndarray,
            past: list[Any] | None = None) -> list[Any]:
        """Run the graph on ``ids`` (rows, new) int64 after the cache: ``feeds`` are the other
        inputs by name (the mask, or a shared buffer's lengths), the logits are written into
        ``logits`` (rows x positions, vocab). ``past``: the cache to read (one value per cache
        input), its present returned as new values; None: the shared buffers bound (returns
        them, written in place)."""
        self.input_array("input_ids", ids)
        for name, array in feeds.items():
            self.input_array(name, array)
        if self.logits is not logits:
            self.io.bind_ortvalue_output("logits", ort.OrtValue.ortvalue_from_numpy(logits))
            self.logits = logits
        graph = self.graph
        if past is not None:
            for name, value in zip(graph.past_names, past, strict=True):
                self.io.bind_ortvalue_input(name, value)
            for name in graph.present_names:
                self.io.bind_output(name, graph.device)
            self.shared = None
        graph.session.run_with_iobinding(self.io)
        if past is None:
            return self.shared
        return self.io.get_outputs()[1:]
