"""One copy of every weight per export folder, and export folders that stay inside themselves.

Graphs rewritten by another tool (onnxruntime's int8 quantizer, its offline optimizer) carry
their own copies of the weights; :func:`share_weights` moves every tensor of every graph into one
``weights.data`` file, stored once by content: a tensor equal to one already stored points at the
same bytes. Large tensors start at page-aligned offsets, so onnxruntime maps them from the file
on the CPU instead of reading them into memory, and two sessions on the folder share the pages.

Reading a folder back (its graphs checked against the manifest, nothing read from outside
it) is the runtime's: :mod:`transformer_kit.runtime.manifest`.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

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
