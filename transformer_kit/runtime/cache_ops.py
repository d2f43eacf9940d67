"""Moving a key/value cache's rows and columns on its device: one run of a small ONNX graph per
operation, every cached tensor in it (beam search's reorders, rows joining or leaving a running
batch, a prefix cache's entries, the columns of rejected drafts)."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import onnxruntime as ort

_ONNX_TYPES = {"tensor(float)": 1, "tensor(float16)": 10, "tensor(int64)": 7}  # TensorProto ids


@functools.cache
def _helper_graph(kind: str, types: tuple[str, ...]) -> bytes:
    """A small ONNX model over tensors ``t{i}`` (rows, heads, length, dim) of ``types``, one node
    chain per tensor, outputs ``o{i}``:

    - ``gather``: ``index`` (n,) int64 -> t{i}[index] (rows along axis 0);
    - ``concat``: ``u{i}`` too -> Concat(t{i}, u{i}) along axis 0 (tensors of any rank);
    - ``join``: ``u{i}`` too, ``pads_t``/``pads_u`` (8,) int64 -> Concat(Pad(t{i}), Pad(u{i}))
      along axis 0 (each side padded with zeros on the left of its length axis to one length);
    - ``pad``: ``pads`` (8,) int64 -> Pad(t{i}) (zeros around its length axis);
    - ``trim``: ``start`` (1,) int64 -> t{i}[:, :, start:];
    - ``take``: ``index`` (n,) and ``columns`` (m,) int64 -> t{i}[index][:, :, columns].
    """
    from onnx import TensorProto, helper

    int64 = TensorProto.INT64
    scalars = {"gather": [("index", ["n"])], "concat": [], "join": [("pads_t", [8]), ("pads_u", [8])],
               "pad": [("pads", [8])], "trim": [("start", [1]), ("end", [1]), ("axis", [1])],
               "take": [("index", ["n"]), ("columns", ["m"])]}[kind]
    inputs = [helper.make_tensor_value_info(name, int64, shape) for name, shape in scalars]
    nodes, outputs = [], []
    for i, type_name in enumerate(types):
        elem = _ONNX_TYPES[type_name]
        inputs.append(helper.make_tensor_value_info(f"t{i}", elem, None))
        outputs.append(helper.make_tensor_value_info(f"o{i}", elem, None))
        if kind == "gather":
            nodes.append(helper.make_node("Gather", [f"t{i}", "index"], [f"o{i}"], axis=0))
        elif kind == "concat":
            inputs.append(helper.make_tensor_value_info(f"u{i}", elem, None))
            nodes.append(helper.make_node("Concat", [f"t{i}", f"u{i}"], [f"o{i}"], axis=0))
        elif kind == "join":
            inputs.append(helper.make_tensor_value_info(f"u{i}", elem, None))
            nodes += [helper.make_node("Pad", [f"t{i}", "pads_t"], [f"pt{i}"]),
                      helper.make_node("Pad", [f"u{i}", "pads_u"], [f"pu{i}"]),
                      helper.make_node("Concat", [f"pt{i}", f"pu{i}"], [f"o{i}"], axis=0)]
        elif kind == "pad":
            nodes.append(helper.make_node("Pad", [f"t{i}", "pads"], [f"o{i}"]))
        elif kind == "take":
            nodes += [helper.make_node("Gather", [f"t{i}", "index"], [f"r{i}"], axis=0),
                      helper.make_node("Gather", [f"r{i}", "columns"], [f"o{i}"], axis=2)]
        else:
            nodes.append(helper.make_node("Slice", [f"t{i}", "start", "end", "axis"], [f"o{i}"]))
    graph = helper.make_graph(nodes, f"cache_{kind}", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model.SerializeToString()


class CacheOps:
    """Moves the rows and columns of many onnxruntime values (a key/value cache) in one run of
    a small graph each, on the values' device: gather rows (beam search, rows leaving a batch),
    concatenate rows (encoder outputs of rows joining a batch), join two batches (rows joining
    a running batch), pad columns on either side (a prompt's cache aligned), trim leading
    columns, take rows and columns (a prefix cache's entries). One session per operation and
    input signature."""

    def __init__(self, providers: list, device: str) -> None:
        self.providers, self.device = providers, device
        self.sessions: dict[tuple[str, tuple[str, ...]], ort.InferenceSession] = {}

    def _binding(self, kind: str, values: list[Any]) -> _Run:
        types = tuple(v.data_type() for v in values)
        session = self.sessions.get((kind, types))
        if session is None:
            options = ort.SessionOptions()
            # the calling thread alone: a thread pool of its own would spin after each gather and
            # take the cores from the decoder step that follows
            options.intra_op_num_threads = 1
            session = self.sessions[kind, types] = ort.InferenceSession(
                _helper_graph(kind, types), options, providers=self.providers)
        run = _Run(session, self.device)
        for i, value in enumerate(values):
            run.io.bind_ortvalue_input(f"t{i}", value)
            run.io.bind_output(f"o{i}", self.device)
        return run

    def gather(self, values: list[Any], rows: np.ndarray) -> list[Any]:
        """values[i][rows] for each value (rows (n,) int64 indices along axis 0)."""
        binding = self._binding("gather", values)
        binding.input_array("index", np.ascontiguousarray(rows, dtype=np.int64))
        return binding.run()

    def concat(self, values: list[Any], more: list[Any]) -> list[Any]:
        """Each value with the rows of its match in ``more`` after its own (tensors of any
        rank, alike but in rows)."""
        binding = self._binding("concat", values)
        for i, value in enumerate(more):
            binding.input_value(f"u{i}", value)
        return binding.run()

    def join(self, values: list[Any], more: list[Any], pad: int, pad_more: int) -> list[Any]:
        """Each value with the rows of its match in ``more`` after its own, each side first
        padded with ``pad`` / ``pad_more`` zero columns on the left of its length axis (2)."""
        binding = self._binding("join", values)
        for i, value in enumerate(more):
            binding.input_value(f"u{i}", value)
        binding.input_array("pads_t", np.array([0, 0, pad, 0, 0, 0, 0, 0], np.int64))
        binding.input_array("pads_u", np.array([0, 0, pad_more, 0, 0, 0, 0, 0], np.int64))
        return binding.run()

    def pad(self, values: list[Any], left: int, right: int) -> list[Any]:
        """Each value with ``left`` zero columns before and ``right`` after its length axis (2)."""
        if not left and not right:
            return values
        binding = self._binding("pad", values)
        binding.input_array("pads", np.array([0, 0, left, 0, 0, 0, right, 0], np.int64))
        return binding.run()

    def trim(self, values: list[Any], start: int) -> list[Any]:
        """Each value without its first ``start`` columns of the length axis (2)."""
        binding = self._binding("trim", values)
        binding.input_array("start", np.array([start], np.int64))
        binding.input_array("end", np.array([np.iinfo(np.int64).max], np.int64))
        binding.input_array("axis", np.array([2], np.int64))
        return binding.run()

    def take(self, values: list[Any], rows: np.ndarray, columns: np.ndarray) -> list[Any]:
        """values[i][rows][:, :, columns] for each value: rows (n,) and columns (m,) int64
        indices (repeated rows make copies of a row; columns may skip padding inside a row)."""
        binding = self._binding("take", values)
        binding.input_array("index", np.ascontiguousarray(rows, dtype=np.int64))
        binding.input_array("columns", np.ascontiguousarray(columns, dtype=np.int64))
        return binding.run()


class _Run:
    """One run of a helper graph: its binding (values on the device, small index arrays from
    numpy, kept alive until the run)."""

    def __init__(self, session: ort.InferenceSession, device: str) -> None:
        self.session, self.io, self.arrays = session, session.io_binding(), []

    def input_array(self, name: str, array: np.ndarray) -> None:
        self.arrays.append(array)
        self.io.bind_cpu_input(name, array)

    def input_value(self, name: str, value: Any) -> None:
        self.io.bind_ortvalue_input(name, value)

    def run(self) -> list[Any]:
        self.session.run_with_iobinding(self.io)
        return self.io.get_outputs()
