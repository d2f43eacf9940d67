"""Streaming an export's weights into ``weights.data``, one tensor at a time.

The built graphs (``model_graphs.py``) name their weights but hold none. :class:`WeightWriter` walks
each graph, reads every weight from its source when it is written (a model's parameter, or a
checkpoint tensor read and converted on demand) and appends it to the export's one
``weights.data``, so at most one weight (and its quantized form) is in memory at a time, and no
graph ever holds its weights inside. What a graph computes from weights alone is done
here, on each weight: ``Transpose`` and ``Concat`` of weights (a linear layer's transposed
matrix, the packed q/k/v and gate/up matrices) are folded into the bytes written; with int4,
``MatMul`` becomes ``MatMulNBits`` and the token embedding's ``Gather`` becomes
``GatherBlockQuantized`` over the same 4-bit bytes when the head is tied; a tied float head
reads the embedding table once through ``FusedMatMul(transB=1)`` instead of a transposed copy;
a GGUF model's own blocks where they map exactly (``gguf_blocks.py``). Each distinct tensor is
stored once (by content), whichever graphs read it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import numpy as np
import onnx_ir as ir
import torch
from torch import Tensor

from transformer_kit.errors import ExportError
from transformer_kit.export.gguf_blocks import FileBlocks
from transformer_kit.export.quantize import Int4
from transformer_kit.export.quantized_writes import MICROSOFT, QuantizedWrites
from transformer_kit.export.weight_exprs import FOLDED_OPS, Expr, fold, head_matmuls, name_of
from transformer_kit.export.weights import INLINE_BYTES, WEIGHTS_FILE, WeightsFile


class WeightSource(Protocol):
    """Where the weights come from, by state-dict name."""

    def load(self, name: str) -> Tensor:
        """The tensor ``name`` in memory (a float of any dtype), read now."""


class ModelWeights:
    """The parameters of a model in memory, by state-dict name (tied names included)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.tensors = dict(model.named_parameters(remove_duplicate=False))

    def load(self, name: str) -> Tensor:
        if name not in self.tensors:
            raise ExportError(f"The graph reads a weight {name!r} that the model does not have.")
        return self.tensors[name]


def weight_source(model: torch.nn.Module) -> WeightSource:
    """Where ``model``'s weights are read from: its checkpoint when it was loaded with
    ``stream=True``, else its parameters."""
    streamed = getattr(model, "streamed_weights", None)
    return streamed if streamed is not None else ModelWeights(model)


def _numpy(tensor: Tensor) -> np.ndarray:
    tensor = tensor.detach()
    if tensor.dtype == torch.bfloat16:  # numpy has no bfloat16
        tensor = tensor.float()
    return tensor.cpu().numpy()


class WeightWriter(QuantizedWrites):
    """Writes the weights of the graphs given to :meth:`write` into ``folder/weights.data``."""

    def __init__(self, folder: Path, source: WeightSource, int4: Int4 | None = None,
                 file_blocks: FileBlocks | None = None,
                 importance: dict[str, np.ndarray] | Callable[[], dict[str, np.ndarray]] | None = None,
                 ) -> None:
        self.folder = folder
        self.source = source
        self.int4 = int4
        self.file_blocks = file_blocks  # a GGUF model's own blocks, written instead of quantizing
        self._importance = {} if importance is None else importance  # or what computes it
        self.file = WeightsFile(folder / (WEIGHTS_FILE + ".new"))
        self.placed: dict[tuple, tuple | np.ndarray] = {}  # (expr, dtype) -> where, or small array
        self.quantized: dict[Expr, dict] = {}  # rows expr -> what quantize_rows wrote
        self.eight_bit: set[Expr] = set()  # rows exprs quantized in 8 bits (Int4.eight_bit)

    def importance(self) -> dict[str, np.ndarray]:
        """Weight name -> (K,) its inputs' mean squares over the calibration text; when given as
        what computes it, computed the first time a product is quantized here (a GGUF model whose
        products all take the file's blocks never runs the calibration pass)."""
        if callable(self._importance):
            self._importance = self._importance()
        return self._importance

    # -- values ---------------------------------------------------------------------------------
    def evaluate(self, expr: Expr) -> np.ndarray:
        """The array ``expr`` stands for, read from the source now."""
        if expr[0] == "weight":
            return _numpy(self.source.load(expr[1]))
        if expr[0] == "transpose":
            return np.transpose(self.evaluate(expr[1]), expr[2])
        return np.concatenate([self.evaluate(e) for e in expr[1]], axis=expr[2])

    def _place(self, expr: Expr, dtype: ir.DataType) -> tuple[int, int, tuple[int, ...]] | np.ndarray:
        """``expr`` in ``dtype`` appended to weights.data once: (offset, length, shape); or the
        array itself when it is small enough to stay inside its graph."""
        key = (expr, dtype)
        if key not in self.placed:
            array = np.ascontiguousarray(self.evaluate(expr), dtype=dtype.numpy())
            self.placed[key] = array if array.nbytes < INLINE_BYTES else (
                *self.file.place(array), array.shape)
        return self.placed[key]

    def _external(self, name: str, dtype: ir.DataType, offset: int, length: int,
                  shape: tuple[int, ...]) -> ir.ExternalTensor:
        return ir.ExternalTensor(WEIGHTS_FILE, offset, length, dtype, shape=ir.Shape(shape),
                                 name=name, base_dir=str(self.folder))

    def _initializer(self, graph: ir.Graph, name: str, dtype: ir.DataType, offset: int,
                     length: int, shape: tuple[int, ...]) -> ir.Value:
        """The initializer ``name`` of ``graph`` reading ``length`` bytes at ``offset`` of
        weights.data (created, or given its value when the graph named it without one)."""
        return self._holding(graph, name, dtype, shape,
                             lambda: self._external(name, dtype, offset, length, shape))

    @staticmethod
    def _holding(graph: ir.Graph, name: str, dtype: ir.DataType, shape: tuple[int, ...],
                 tensor: Callable[[], ir.TensorProtocol]) -> ir.Value:
        value = graph.initializers.get(name)
        if value is None:
            value = ir.Value(name=name, shape=ir.Shape(shape), type=ir.TensorType(dtype),
                             const_value=tensor())
            graph.register_initializer(value)
        elif value.const_value is None:
            value.const_value = tensor()
        return value

    def _materialize(self, graph: ir.Graph, expr: Expr, like: ir.Value) -> ir.Value:
        """A graph initializer holding ``expr`` in ``like``'s dtype (inside the graph when small)."""
        dtype = like.dtype or ir.DataType.FLOAT
        placed = self._place(expr, dtype)
        if not isinstance(placed, np.ndarray):
            return self._initializer(graph, name_of(expr), dtype, *placed)
        return self._holding(graph, name_of(expr), dtype, placed.shape,
                             lambda: ir.Tensor(placed, name=name_of(expr)))

    # -- rewrites -------------------------------------------------------------------------------
    def _replace(self, graph: ir.Graph, node: ir.Node, new: list[ir.Node]) -> None:
        ir.convenience.replace_nodes_and_values(graph, node, [node], new, node.outputs, new[-1].outputs)

    def _fused_transposed(self, graph: ir.Graph, node: ir.Node, matrix: Expr, like: ir.Value) -> None:
        value = self._materialize(graph, matrix, like)
        self._replace(graph, node, [ir.node("FusedMatMul", [node.inputs[0], value],
                                            {"transA": 0, "transB": 1, "alpha": 1.0},
                                            domain=MICROSOFT, name=f"{node.name}_transB")])

    def _quantizable_gather(self, graph: ir.Graph, node: ir.Node, value: ir.Value) -> bool:
        """A token embedding: Gather along rows of a (vocab, width) weight by a graph input,
        width a multiple of the block."""
        axis = node.attributes.get("axis")
        shape = value.shape
        return (self.int4 is not None and self.int4.embedding and node.op_type == "Gather"
                and (axis is None or axis.as_int() == 0) and node.inputs[1] in graph.inputs
                and shape is not None and len(shape) == 2 and isinstance(shape[1], int)
                and shape[1] % self.int4.block_size == 0)

    def write(self, model: ir.Model, prefix: str, path: Path,
              progress: Callable[[int, int], None] | None = None) -> None:
        """Fold, quantize and write the weights of ``model`` (a built graph, with ``prefix``
        before the state-dict names), then save the graph as ``path``.
        ``progress(done, total)`` is called after each weight the graph reads."""
        graph = model.graph
        exprs: dict[ir.Value, Expr] = {}
        for value in graph.initializers.values():
            if value.const_value is None:
                name = value.name[len(prefix):] if value.name.startswith(prefix) else value.name
                exprs[value] = ("weight", name)
        folded: set[ir.Node] = set()
        for node in graph:
            if (node.domain in ("", "ai.onnx") and node.op_type in FOLDED_OPS and node.inputs
                    and all(v in exprs for v in node.inputs)):
                rank = len(node.inputs[0].shape) if node.inputs[0].shape is not None else None
                exprs[node.outputs[0]] = fold(node, [exprs[v] for v in node.inputs], rank)
                folded.add(node)
        uses = [(node, i, v) for node in graph if node not in folded
                for i, v in enumerate(node.inputs) if v in exprs]
        plain = {}
        for node, _, value in uses:
            plain.setdefault(exprs[value], []).append(node)
        heads = head_matmuls(graph) if self.int4 is not None else set()
        head = heads if self.int4 is not None and not self.int4.head else set()
        if self.int4 is not None and self.int4.eight_bit:
            self.eight_bit |= self._eight_bit_rows(graph, uses, exprs, heads)
        replaced: set[ir.Node] = set()
        for done, (node, index, value) in enumerate(uses, start=1):
            if progress is not None:
                progress(done, len(uses))
            if node in replaced:
                continue
            expr = exprs[value]
            matrix = value.shape is not None and len(value.shape) == 2
            if (self.int4 is not None and node.op_type == "MatMul" and node.domain == "" and index == 1
                    and matrix and node not in head):
                self._matmul_nbits(graph, node, expr)
                replaced.add(node)
            elif self._quantizable_gather(graph, node, value) and index == 0:
                self._gather_quantized(graph, node, expr)
                replaced.add(node)
            elif (node.op_type == "MatMul" and node.domain == "" and index == 1 and matrix
                  and expr[0] == "transpose" and any(n is not node for n in plain.get(expr[1], []))):
                self._fused_transposed(graph, node, expr[1], value)
                replaced.add(node)
            else:
                node.replace_input_with(index, self._materialize(graph, expr, value))
        for node in reversed([n for n in graph if n in folded]):
            if not any(v.uses() or v in graph.outputs for v in node.outputs):
                graph.remove(node, safe=True)
        for value in list(exprs):
            if value.name in graph.initializers and not value.uses():
                graph.initializers.pop(value.name)
        if any(node.domain == MICROSOFT for node in graph):
            model.opset_imports.setdefault(MICROSOFT, 1)
        self._externalize_constants(graph)
        ir.save(model, path)

    def _externalize_constants(self, graph: ir.Graph) -> None:
        """Large initializers with values (buffers: position tables) go to weights.data too."""
        for value in graph.initializers.values():
            tensor = value.const_value
            if tensor is None or isinstance(tensor, ir.ExternalTensor) or tensor.nbytes < INLINE_BYTES:
                continue
            array = np.ascontiguousarray(tensor.numpy())
            offset, length = self.file.place(array)
            value.const_value = self._external(value.name, value.dtype, offset, length, array.shape)

    def close(self) -> int:
        """Finish ``weights.data`` (or remove it when every tensor stayed in its graph);
        returns its size in bytes."""
        self.file.close()
        staged = self.folder / (WEIGHTS_FILE + ".new")
        if self.file.offset:
            staged.replace(self.folder / WEIGHTS_FILE)
        else:
            staged.unlink()
        return self.file.offset
