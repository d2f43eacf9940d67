"""One copy of every weight per export folder, and export folders that stay inside themselves.

Graphs rewritten by another tool (onnxruntime's int8 quantizer, its offline optimizer) carry
their own copies of the weights; :func:`share_weights` moves every tensor of every graph into one
``weights.data`` file, stored once by content: a tensor equal to one already stored points at the
same bytes. Large tensors start at page-aligned offsets, so onnxruntime maps them from the file
on the CPU instead of reading them into memory, and two sessions on the folder share the pages.

:func:`check_graph` refuses a graph that is unreadable, does not match its manifest or
reads external data from outside its folder.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper
from onnx.external_data_helper import uses_external_data

from transformer_kit.core.errors import ArtifactError

WEIGHTS_FILE = "weights.data"
#: Smaller tensors (scalars, shapes) stay inside their graph.
INLINE_BYTES = 1024
#: Tensors of this size or more start at a page boundary (onnxruntime maps those from the file).
ALIGN_BYTES, PAGE = 1 << 20, 4096


def _content_key(array: np.ndarray) -> tuple:
    data = np.ascontiguousarray(array).reshape(-1).view(np.uint8)  # no copy when contiguous
    return array.dtype.str, array.shape, hashlib.sha256(data).digest()


class WeightsFile:
    """Appends tensors to ``weights.data`` once each and remembers where they went."""

    def __init__(self, path: Path) -> None:
        self.file = path.open("wb")
        self.offset = 0
        self.stored: dict[tuple, tuple[int, int]] = {}  # content key -> (offset, length)

    def place(self, array: np.ndarray) -> tuple[int, int]:
        """(offset, length) of ``array``'s bytes in the file, written there if new."""
        key = _content_key(array)
        if key in self.stored:
            return self.stored[key]
        array = np.ascontiguousarray(array)
        if array.nbytes >= ALIGN_BYTES and self.offset % PAGE:
            padding = PAGE - self.offset % PAGE
            self.file.write(b"\0" * padding)
            self.offset += padding
        self.stored[key] = (self.offset, array.nbytes)
        self.file.write(array.reshape(-1).view(np.uint8).data)  # written as it lies in memory
        self.offset += array.nbytes
        return self.stored[key]

    def close(self) -> None:
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()


def _externalize(tensor: TensorProto, offset: int, length: int) -> None:
    for field in ("raw_data", "float_data", "int32_data", "int64_data", "double_data",
                  "uint64_data", "string_data", "external_data"):
        tensor.ClearField(field)
    for key, value in (("location", WEIGHTS_FILE), ("offset", offset), ("length", length)):
        tensor.external_data.add(key=key, value=str(value))
    tensor.data_location = TensorProto.EXTERNAL


def _share_graph(proto: onnx.ModelProto, weights: WeightsFile) -> None:
    for tensor in proto.graph.initializer:
        array = numpy_helper.to_array(tensor)
        if array.nbytes >= INLINE_BYTES:
            _externalize(tensor, *weights.place(array))


def share_weights(folder: Path, files: list[str]) -> int:
    """Rewrite the graphs ``files`` in ``folder`` to read their tensors from one
    ``weights.data``, each distinct tensor stored once; returns that file's size in bytes.
    Meant for a staging folder: between the first graph written and the end, the graphs point
    at a file that is still being written."""
    staged = folder / (WEIGHTS_FILE + ".new")
    weights = WeightsFile(staged)
    try:
        for file in files:  # one graph's tensors in memory at a time
            proto = onnx.load(str(folder / file), load_external_data=True)
            _share_graph(proto, weights)
            onnx.save_model(proto, str(folder / file))  # reads weights.data once renamed below
            del proto
    finally:
        weights.close()
    for stale in [p for file in files for p in folder.glob(file + ".data")]:
        stale.unlink()
    if weights.offset:
        staged.replace(folder / WEIGHTS_FILE)
    else:  # every tensor is small enough to stay in its graph
        staged.unlink()
        (folder / WEIGHTS_FILE).unlink(missing_ok=True)
    return weights.offset


def inside(folder: Path, relative: str) -> bool:
    """Whether ``relative`` names a path within ``folder`` (no absolute path, no ``..`` out,
    no link leading elsewhere)."""
    if not relative or Path(relative).is_absolute():
        return False
    root = folder.resolve()
    return (root / relative).resolve().is_relative_to(root)


def check_graph(folder: Path, file: str, inputs: list[str], outputs: list[str]) -> None:
    """Read graph ``file`` of ``folder`` (without its weights) and refuse it, with an
    :class:`ArtifactError`, when it is unreadable, its inputs or outputs are not ``inputs``
    and ``outputs``, or any of its external data lies outside ``folder``."""
    try:
        proto = onnx.load(str(folder / file), load_external_data=False)
    except Exception as exc:  # protobuf's DecodeError and others
        raise ArtifactError(f"onnxruntime cannot load {str(folder / file)!r}: it is not a readable "
                            f"ONNX graph ({type(exc).__name__}). The file may be truncated or corrupt; "
                            "export the model again.") from None
    graph = proto.graph
    initializers = {t.name for t in graph.initializer}
    found_inputs = [i.name for i in graph.input if i.name not in initializers]
    found_outputs = [o.name for o in graph.output]
    if found_inputs != inputs or found_outputs != outputs:
        raise ArtifactError(
            f"{file} does not match the manifest: the graph has inputs {found_inputs} and "
            f"outputs {found_outputs}, the manifest lists {inputs} and {outputs}. "
            "Export the model again.")
    tensors = list(graph.initializer) + [
        a.t for n in graph.node for a in n.attribute if a.type == onnx.AttributeProto.TENSOR]
    for tensor in tensors:
        if not uses_external_data(tensor):
            continue
        location = next((e.value for e in tensor.external_data if e.key == "location"), "")
        if not inside(folder, location):
            raise ArtifactError(
                f"{file} in {str(folder)!r} reads tensor {tensor.name!r} from {location!r}, outside "
                "the export folder; refusing to load it. Export the model again.")
