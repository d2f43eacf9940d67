"""Decoding steps in onnxruntime: the :class:`~transformer_kit.decoding.Stepper` of
``OnnxModel``, with the key/value cache kept in onnxruntime between steps and reordered there.

Beam search and several samples per prompt move cache rows every step. The rows are gathered by
one small ONNX graph (a ``Gather`` per cached tensor, every layer in one ``run``), so the cache
is never copied through Python or numpy, and on CUDA it stays on the device.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import onnxruntime as ort

_ONNX_TYPES = {"tensor(float)": 1, "tensor(float16)": 10, "tensor(int64)": 7}  # TensorProto ids


@functools.cache
def _gather_graph(types: tuple[str, ...]) -> bytes:
    """An ONNX model: ``index`` (n,) int64 and tensors ``t{i}`` (rows, ...) -> ``o{i}`` =
    t{i}[index] for each, one ``Gather`` along axis 0 per tensor."""
    from onnx import TensorProto, helper

    nodes, inputs, outputs = [], [helper.make_tensor_value_info("index", TensorProto.INT64, ["n"])], []
    for i, kind in enumerate(types):
        elem = _ONNX_TYPES[kind]
        inputs.append(helper.make_tensor_value_info(f"t{i}", elem, None))
        outputs.append(helper.make_tensor_value_info(f"o{i}", elem, None))
        nodes.append(helper.make_node("Gather", [f"t{i}", "index"], [f"o{i}"], axis=0))
    graph = helper.make_graph(nodes, "gather_rows", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model.SerializeToString()


class RowGather:
    """Gathers rows of many onnxruntime values in one call; a session per input signature."""

    def __init__(self, providers: list, device: str) -> None:
        self.providers, self.device = providers, device
        self.sessions: dict[tuple[str, ...], ort.InferenceSession] = {}

    def __call__(self, values: list[ort.OrtValue], rows: np.ndarray) -> list[ort.OrtValue]:
        types = tuple(v.data_type() for v in values)
        session = self.sessions.get(types)
        if session is None:
            options = ort.SessionOptions()
            # the calling thread alone: a thread pool of its own would spin after each gather and
            # take the cores from the decoder step that follows (measured: +2.5 ms a step)
            options.intra_op_num_threads = 1
            session = self.sessions[types] = ort.InferenceSession(
                _gather_graph(types), options, providers=self.providers)
        io = session.io_binding()
        io.bind_cpu_input("index", np.ascontiguousarray(rows, dtype=np.int64))
        for i, value in enumerate(values):
            io.bind_ortvalue_input(f"t{i}", value)
            io.bind_output(f"o{i}", self.device)
        session.run_with_iobinding(io)
        return io.get_outputs()


class OnnxStepper:
    """Feeds the decoder step graph: the prompt first (zero-length past), then one token per
    row, handing each step's ``present.*`` to the next as ``past_key_values.*`` without a copy.

    The attention mask lives in one buffer that doubles when full (memory grows with the tokens
    generated, not with ``max_new_tokens``) and the logits are written into one preallocated
    array per row count, so a step allocates nothing in Python besides the mask view.
    """

    def __init__(self, session: ort.InferenceSession, graph: Any, fixed: dict[str, ort.OrtValue],
                 first_ids: np.ndarray, keep: np.ndarray | None, empty_cache, vocab: int,
                 logits_dtype: type, gather: RowGather, device: str) -> None:
        self.session, self.gather, self.device = session, gather, device
        self.past_names = [n for n in graph.inputs if n.startswith("past_key_values.")]
        self.present_names = [n for n in graph.outputs if n.startswith("present.")]
        self.fixed = {k: v for k, v in fixed.items() if k in graph.inputs}
        rows = first_ids.shape[0]
        self.past = [empty_cache(rows)] * len(self.past_names)
        self.first_ids = first_ids
        self.length = first_ids.shape[1]
        self.mask = None
        if keep is not None:
            self.mask = np.ones((rows, 2 * self.length + 8), np.int64)
            self.mask[:, :self.length] = keep
        self.vocab, self.logits_dtype = vocab, logits_dtype
        self.logits: np.ndarray | None = None
        self.logits_value: ort.OrtValue | None = None

    def first(self) -> np.ndarray:
        return self._run(self.first_ids)

    def next(self, tokens: np.ndarray, rows: np.ndarray | None) -> np.ndarray:
        if rows is not None:
            self._reorder(rows)
        self.length += 1
        if self.mask is not None and self.length > self.mask.shape[1]:
            grown = np.ones((len(self.mask), 2 * self.mask.shape[1]), np.int64)
            grown[:, :self.mask.shape[1]] = self.mask
            self.mask = grown
        return self._run(np.ascontiguousarray(tokens, dtype=np.int64)[:, None])

    def _reorder(self, rows: np.ndarray) -> None:
        """Every row-indexed state: cache, fixed encoder outputs and mask, gathered by ``rows``."""
        fixed_names = list(self.fixed)
        gathered = self.gather([*self.past, *self.fixed.values()], rows)
        self.past = gathered[:len(self.past)]
        self.fixed = dict(zip(fixed_names, gathered[len(self.past):], strict=True))
        if self.mask is not None:
            self.mask = self.mask[rows]

    def _run(self, ids: np.ndarray) -> np.ndarray:
        rows = ids.shape[0]
        if self.logits is None or len(self.logits) != rows:
            self.logits = np.empty((rows, self.vocab), self.logits_dtype)
            self.logits_value = ort.OrtValue.ortvalue_from_numpy(self.logits)
        io = self.session.io_binding()
        io.bind_cpu_input("input_ids", ids)
        if self.mask is not None:
            io.bind_cpu_input("attention_mask", np.ascontiguousarray(self.mask[:, :self.length]))
        for name, value in self.fixed.items():
            io.bind_ortvalue_input(name, value)
        for name, value in zip(self.past_names, self.past, strict=True):
            io.bind_ortvalue_input(name, value)
        io.bind_ortvalue_output("logits", self.logits_value)
        for name in self.present_names:
            io.bind_output(name, self.device)
        self.session.run_with_iobinding(io)
        self.past = io.get_outputs()[1:]
        return self.logits
