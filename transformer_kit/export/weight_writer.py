"""Streaming an export's weights into ``weights.data``, one tensor at a time.

The built graphs (``model_graphs.py``) name their weights but hold none. :class:`WeightWriter` walks
each graph, reads every weight from its source when it is written (a model's parameter, or a
checkpoint tensor read and converted on demand) and appends it to the export's one
``weights.data``, so at most one weight (and its quantized form) is in memory at a time, and no
graph ever holds its weights inside. What a graph computes from weights alone is done here, on each
weight: ``Transpose``, ``Concat`` and ``Reshape`` of weights (a linear layer's transposed matrix,
the packed q/k/v and gate/up matrices, a mixture of experts' stacked experts) are folded into the
bytes written; with int4, ``MatMul`` becomes ``MatMulNBits`` and the token embedding's ``Gather``
becomes ``GatherBlockQuantized`` over the same 4-bit bytes when the head is tied; a tied float head
reads the embedding table once through ``FusedMatMul(transB=1)`` instead of a transposed copy; a
GGUF model's own blocks where they map exactly (``gguf_blocks.py``). A quantized matrix's rows are
written once, in 4-bit blocks (8-bit for the roles ``Int4.eight_bit`` names), whichever nodes read
them. Each distinct tensor is stored once (by content), whichever graphs read it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import numpy as np
import onnx_ir as ir
import torch
from torch import Tensor

from transformer_kit.core.errors import ExportError
from transformer_kit.core.model import TransformerModel
from transformer_kit.export.gguf_blocks import FileBlocks
from transformer_kit.export.int4_nodes import (
    QuantizedRows,
    dequantize_rows,
    gather_offset_nodes,
    offset_nodes,
    quantize_rows,
)
from transformer_kit.export.quantize import Int4
from transformer_kit.export.quantized_experts import (
    MOE_FC1,
    MOE_FC1_BIAS,
    MOE_FC2,
    MOE_FC2_BIAS,
    ExpertBits,
    StackedBlocks,
    expert_parts,
    file_experts,
    qmoe_attributes,
    quantize_experts,
)
from transformer_kit.export.weight_exprs import (
    FOLDED_OPS,
    Expr,
    fold,
    head_matmuls,
    name_of,
    router_matmuls,
    simplify,
)
from transformer_kit.export.weights import INLINE_BYTES, WEIGHTS_FILE, WeightsFile

MICROSOFT = "com.microsoft"


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


def weight_source(model: TransformerModel) -> WeightSource:
    """Where ``model``'s weights are read from: its checkpoint when it was loaded with
    ``stream=True``, else its parameters."""
    return model.streamed_weights if model.streamed_weights is not None else ModelWeights(model)


def _numpy(tensor: Tensor) -> np.ndarray:
    tensor = tensor.detach()
    if tensor.dtype == torch.bfloat16:  # numpy has no bfloat16
        tensor = tensor.float()
    return tensor.cpu().numpy()


def _weight_names(expr: Expr) -> list[str]:
    """The state-dict names of the weights ``expr`` reads."""
    if expr[0] == "weight":
        return [expr[1]]
    if expr[0] in ("transpose", "reshape"):
        return _weight_names(expr[1])
    return [name for part in expr[1] for name in _weight_names(part)]


#: A weight of a stack's layer: the stack's path and the layer's index (``decoder.layers.3.``).
_LAYER = re.compile(r"^(.*\.layers)\.(\d+)\.")


def early_layers(names: list[str]) -> set[tuple[str, int]]:
    """(stack, index) of the layers in the first eighth of each stack whose weights ``names``
    holds (layer i of n with i < n / 8: at least the first; llama.cpp's ``use_more_bits``
    gives its Q4_K_M's first layers more bits so)."""
    counts: dict[str, int] = {}
    for match in filter(None, map(_LAYER.match, names)):
        counts[match[1]] = max(counts.get(match[1], 0), int(match[2]) + 1)
    return {(stack, i) for stack, n in counts.items() for i in range(n) if 8 * i < n}


def rows_importance(importance: dict[str, np.ndarray], names: list[str], k: int) -> np.ndarray | None:
    """The importance of a product's rows read from the weights ``names`` (one weight, or
    several stacked along the rows: a packed q/k/v, which share their inputs): their mean when
    every one has an importance of length ``k``, else None (the rows are weighed alike)."""
    found = [importance.get(name) for name in names]
    if not found or any(v is None or v.shape != (k,) for v in found):
        return None
    return np.mean(found, axis=0).astype(np.float32)


def _weight_expressions(graph: ir.Graph, prefix: str) -> tuple[dict[ir.Value, Expr], set[ir.Node]]:
    """The weight expression of each value of ``graph`` computed from weights alone: its
    initializers without values (state-dict names, ``prefix`` cut off) and the outputs of the
    ``Transpose``, ``Concat`` and ``Reshape`` nodes of them (folded, returned as the second item)."""
    exprs: dict[ir.Value, Expr] = {}
    for value in graph.initializers.values():
        if value.const_value is None:
            name = value.name[len(prefix):] if value.name.startswith(prefix) else value.name
            exprs[value] = ("weight", name)
    folded: set[ir.Node] = set()
    for node in graph:
        weights = node.inputs[:1] if node.op_type == "Reshape" else node.inputs
        if (node.domain in ("", "ai.onnx") and node.op_type in FOLDED_OPS and node.inputs
                and all(v in exprs for v in weights)
                and (node.op_type != "Reshape" or (len(node.inputs) == 2 and node.inputs[1] is not None
                                                   and node.inputs[1].const_value is not None))):
            rank = len(node.inputs[0].shape) if node.inputs[0].shape is not None else None
            exprs[node.outputs[0]] = fold(node, [exprs[v] for v in weights], rank)
            folded.add(node)
    return exprs, folded


def _remove_unused(graph: ir.Graph, folded: set[ir.Node], exprs: dict[ir.Value, Expr]) -> None:
    """The folded nodes and weight initializers of ``graph`` that nothing reads any more (and
    the constant shapes of folded ``Reshape`` nodes), removed."""
    shapes = [n.inputs[1] for n in folded if n.op_type == "Reshape"]
    for node in reversed([n for n in graph if n in folded]):
        if not any(v.uses() or v in graph.outputs for v in node.outputs):
            graph.remove(node, safe=True)
    for value in list(exprs) + shapes:
        if value.name in graph.initializers and not value.uses():
            graph.initializers.pop(value.name)


class WeightWriter:
    """Writes the weights of the graphs given to :meth:`write` into ``folder/weights.data``."""

    def __init__(self, folder: Path, source: WeightSource, int4: Int4 | None = None,
                 file_blocks: FileBlocks | None = None,
                 importance: dict[str, np.ndarray] | Callable[[], dict[str, np.ndarray]] | None = None,
                 experts: ExpertBits | None = None) -> None:
        self.folder = folder
        self.source = source
        self.int4 = int4
        self.experts = experts  # a quantized export's experts: MoE nodes become QMoE
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
        if expr[0] == "reshape":
            return np.reshape(self.evaluate(expr[1]), expr[2])
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

    # -- quantized rows -------------------------------------------------------------------------
    def _quantize(self, rows: Expr, floats: ir.DataType = ir.DataType.FLOAT) -> dict:
        """``rows`` (N, K) in 4-bit blocks (8-bit for :attr:`eight_bit`, or a GGUF file's own),
        written once: parts, sizes; scales (and a file's offsets) in ``floats``, the type of the
        activations they multiply (float32, or float16 in a half-precision export). Below
        accuracy level 4 the kit's 8-bit rows are written as their values (``"values"``, in
        ``floats``) instead, for their products: onnxruntime 1.31's CPU ``MatMulNBits``
        dequantizes an 8-bit matrix on every call there; their blocks are written too when a
        table reads them (:meth:`_parts`)."""
        if rows not in self.quantized:
            q: QuantizedRows | None = (self.file_blocks.rows(rows, lambda: self._floats(rows))
                                       if self.file_blocks else None)
            own = q is None
            q = q if q is not None else self._own_rows(rows)
            entry = {"n": q.packed.shape[0], "k": q.k, "bits": q.bits, "block_size": q.block_size}
            if own and q.bits == 8 and self.int4.accuracy_level != 4:
                values = dequantize_rows(q).astype(floats.numpy())
                entry["values"] = (*self.file.place(values), values.shape)
            else:
                entry.update(self._placed_parts(q, floats))
            self.quantized[rows] = entry
        return self.quantized[rows]

    def _floats(self, rows: Expr) -> np.ndarray:
        return np.asarray(self.evaluate(rows), dtype=np.float32)

    def _own_rows(self, rows: Expr) -> QuantizedRows:
        """``rows`` quantized here, as ``Int4`` says (the same bits every time), each column's
        error weighed by its calibrated importance when the rows are whole weights."""
        floats = self._floats(rows)
        stacked = rows[0] == "weight" or (rows[0] == "concat" and rows[2] == 0
                                          and all(part[0] == "weight" for part in rows[1]))
        importance = (rows_importance(self.importance(), _weight_names(rows), floats.shape[1])
                      if stacked else None)
        return quantize_rows(floats, self.int4.block_size, self.int4.symmetric,
                             bits=8 if rows in self.eight_bit else 4, rounding=self.int4.rounding,
                             importance=importance)

    def _placed_parts(self, q: QuantizedRows, floats: ir.DataType) -> dict:
        scale_type = floats.numpy()
        parts = {"packed": q.packed, "scales": q.scales.astype(scale_type, copy=False),
                 "zero_points": q.zero_points,
                 "offsets": None if q.offsets is None else q.offsets.astype(scale_type, copy=False)}
        return {part: (*self.file.place(array), array.shape) for part, array in parts.items()
                if array is not None} | {"floats": floats}

    def _parts(self, rows: Expr, floats: ir.DataType) -> dict:
        """:meth:`_quantize`'s entry of ``rows`` with its blocks written."""
        q = self._quantize(rows, floats)
        if "packed" not in q:
            q.update(self._placed_parts(self._own_rows(rows), floats))
        return q

    def _quantized_inputs(self, graph: ir.Graph, rows: Expr, table: bool,
                          floats: ir.DataType) -> list[ir.Value]:
        """[packed, scales, (zero points)] initializers of ``rows``; the packed bytes shaped
        (N, K / 2) as a table for GatherBlockQuantized, else (N, blocks, block / 2); scales in
        ``floats``."""
        q = self._parts(rows, floats)
        base = name_of(rows)
        offset, length, shape = q["packed"]
        if table:
            shape = (shape[0], shape[1] * shape[2])
        values = [self._initializer(graph, f"{base}.int4{'.table' if table else ''}", ir.DataType.UINT8,
                                    offset, length, shape)]
        values.append(self._initializer(graph, f"{base}.scales", q["floats"], *q["scales"]))
        if "zero_points" in q:
            values.append(self._initializer(graph, f"{base}.zero_points", ir.DataType.UINT8,
                                            *q["zero_points"]))
        return values

    def _offsets(self, graph: ir.Graph, rows: Expr) -> ir.Value | None:
        """The (N, K / block) float32 offsets of ``rows`` (a GGUF file's mins), or None."""
        q = self.quantized[rows]
        if "offsets" not in q:
            return None
        return self._initializer(graph, f"{name_of(rows)}.offsets", q["floats"], *q["offsets"])

    def _matmul_nbits(self, graph: ir.Graph, node: ir.Node, weight: Expr) -> None:
        rows = simplify(("transpose", weight, (1, 0)))  # x @ B reads B.T's rows
        if self.file_blocks and self.file_blocks.float_product(rows, self.int4.accuracy_level,
                                                               lambda: self.evaluate(rows)):
            return self._fused_transposed(graph, node, rows, node.inputs[1])
        floats = node.inputs[0].dtype or ir.DataType.FLOAT  # the activations' type
        if "values" in self._quantize(rows, floats):  # 8 bits below accuracy level 4: their values
            value = self._initializer(graph, f"{name_of(rows)}.values", floats,
                                      *self.quantized[rows]["values"])
            return self._replace(graph, node, [ir.node("FusedMatMul", [node.inputs[0], value],
                                                       {"transA": 0, "transB": 1, "alpha": 1.0},
                                                       domain=MICROSOFT, name=f"{node.name}_transB")])
        inputs = self._quantized_inputs(graph, rows, table=False, floats=floats)
        q = self.quantized[rows]
        attributes = {"K": q["k"], "N": q["n"], "bits": q["bits"], "block_size": q["block_size"]}
        if self.int4.accuracy_level:
            attributes["accuracy_level"] = self.int4.accuracy_level
        new = [ir.node("MatMulNBits", [node.inputs[0], *inputs], attributes, domain=MICROSOFT,
                       name=f"{node.name}_int4")]
        offsets = self._offsets(graph, rows)
        if offsets is not None:
            new += offset_nodes(node.inputs[0], new[0].outputs[0], offsets, q["k"], q["block_size"],
                                f"{node.name}_int4")
        self._replace(graph, node, new)

    def _gather_quantized(self, graph: ir.Graph, node: ir.Node, table: Expr) -> None:
        floats = node.inputs[0].dtype or ir.DataType.FLOAT  # the table's type: the output's
        data, *rest = self._quantized_inputs(graph, table, table=True, floats=floats)
        q = self.quantized[table]
        attributes = {"bits": q["bits"], "block_size": q["block_size"], "gather_axis": 0,
                      "quantize_axis": 1}
        new = [ir.node("GatherBlockQuantized", [data, node.inputs[1], *rest], attributes,
                       domain=MICROSOFT, name=f"{node.name}_int4")]
        offsets = self._offsets(graph, table)
        if offsets is not None:
            new += gather_offset_nodes(node.inputs[1], new[0].outputs[0], offsets, q["k"],
                                       q["block_size"], f"{node.name}_int4")
        self._replace(graph, node, new)

    def _eight_bit_rows(self, graph: ir.Graph, uses: list, exprs: dict[ir.Value, Expr],
                        heads: set[ir.Node]) -> set[Expr]:
        """The rows expressions of ``graph`` whose roles ``Int4.eight_bit`` names: the token
        embedding's table, the head's rows (one expression when tied), the products holding a
        value projection (a packed q/k/v one as a whole), a feed-forward's output projection, or
        any product of a stack's first eighth of layers (:func:`early_layers`)."""
        roles = set(self.int4.eight_bit)
        early = (early_layers([name for _, _, value in uses for name in _weight_names(exprs[value])])
                 if "early" in roles else set())
        found = set()
        for node, index, value in uses:
            expr = exprs[value]
            if node.op_type == "MatMul" and node.domain == "" and index == 1:
                rows = simplify(("transpose", expr, (1, 0)))
                weights = _weight_names(rows)
                names = [part.split(".")[-2] for part in weights if "." in part]
                layers = {(m[1], int(m[2])) for m in map(_LAYER.match, weights) if m}
                if (("head" in roles and node in heads) or ("value" in roles and "v_proj" in names)
                        or ("down" in roles and {"down", "linear2"} & set(names))
                        or (layers and layers <= early)):
                    found.add(rows)
            elif "embedding" in roles and index == 0 and self._quantizable_gather(graph, node, value):
                found.add(expr)
        return found

    # -- quantized experts ----------------------------------------------------------------------
    def _part_importance(self, part: Expr, k: int) -> np.ndarray | None:
        """An expert's rows' column importance (its routed inputs' mean squares), when the
        rounding searches."""
        if self.experts is None or self.experts.rounding != "search":
            return None
        return rows_importance(self.importance(), _weight_names(part), k)

    def _file_experts(self, fc1: list[Expr], fc2: list[Expr]) -> tuple[StackedBlocks, StackedBlocks] | None:
        """A GGUF model's experts from the file's own blocks where QMoE holds them exactly
        (``quantized_experts.file_experts``), else None, the reason in the report's origins."""
        if not self.file_blocks:
            return None
        found = file_experts(fc1, fc2, lambda rows: self.file_blocks.rows(rows, lambda: self._floats(rows)))
        if found is None:
            for name in {n for part in fc1 + fc2 for n in _weight_names(part)}:
                origin = self.file_blocks.origins.get(name, "")
                if origin.startswith("GGUF "):
                    kind = origin.removeprefix("GGUF ").removesuffix(" blocks")
                    self.file_blocks.origins[name] = (
                        f"quantized here (GGUF {kind}: QMoE holds a file's experts as they are only "
                        "when all are Q4_0, or all Q8_0: integer blocks without offsets, one width)")
        return found

    def _expert_blocks(self, fc1: Expr, fc2: Expr, parts1: list[Expr], parts2: list[Expr],
                       early: set[tuple[str, int]], floats: ir.DataType) -> tuple | None:
        """(bits, block, [fc1's, fc2's parts written]) of the experts ``fc1``/``fc2`` stack: a
        GGUF file's blocks where QMoE holds them, else quantized here; None where 4 bits have no
        block dividing the widths (the experts stay float)."""
        stacks = self._file_experts(parts1, parts2)
        if stacks is None:
            hidden, inner = fc1[2][2], fc2[2][2]
            layer = _LAYER.match(_weight_names(fc1)[0])
            bits = 8 if layer and (layer[1], int(layer[2])) in early else self.experts.bits
            block = self.experts.block_for((hidden, inner), bits)
            if block is None:
                return None
            stacks = [quantize_experts(parts, self.evaluate, k, bits, block, self.experts,
                                       self._part_importance)
                      for parts, k in ((parts1, hidden), (parts2, inner))]
        return (stacks[0].bits, stacks[0].block_size,
                [self._placed_stack(stack, floats) for stack in stacks])

    def _placed_stack(self, blocks: StackedBlocks, floats: ir.DataType) -> dict:
        """``blocks`` written: part -> (offset, length, shape, type). The scales in ``floats``,
        the activations' type: float16 scales beside float32 activations (a GGUF file's hold in
        float16) cost onnxruntime 1.31's CPU QMoE more memory than they save on disk (its session
        keeps a float32 copy of them as well)."""
        scales = blocks.scales.astype(floats.numpy(), copy=False)
        parts = {"packed": (blocks.packed, ir.DataType.UINT8), "scales": (scales, floats),
                 "zero_points": (blocks.zero_points, ir.DataType.UINT8)}
        return {part: (*self.file.place(array), array.shape, dtype) for part, (array, dtype) in parts.items()
                if array is not None}

    def _qmoe(self, graph: ir.Graph, node: ir.Node, exprs: dict[ir.Value, Expr],
              early: set[tuple[str, int]]) -> bool:
        """The ``MoE`` ``node`` replaced by ``QMoE`` over its experts quantized as
        :attr:`experts` says (``quantized_experts.py``); False (the node left as it is) where
        its weights are not stacked experts or no block divides their widths."""
        fc1, fc2 = exprs.get(node.inputs[MOE_FC1]), exprs.get(node.inputs[MOE_FC2])
        parts1, parts2 = (expert_parts(fc1) if fc1 else None), (expert_parts(fc2) if fc2 else None)
        if not parts1 or not parts2:
            return False
        floats = node.inputs[0].dtype or ir.DataType.FLOAT  # the activations' type
        key = ("qmoe", fc1, fc2, floats)
        if key not in self.quantized:  # once, whichever graphs read these experts
            self.quantized[key] = self._expert_blocks(fc1, fc2, parts1, parts2, early, floats)
        if self.quantized[key] is None:
            return False
        bits, block, written = self.quantized[key]
        stem = _weight_names(fc1)[0].split(".experts.")[0] + ".experts"
        placed = {}
        for fc, entry in zip(("fc1", "fc2"), written, strict=True):
            names = {"packed": f"{stem}.{fc}.int{bits}", "scales": f"{stem}.{fc}.scales",
                     "zero_points": f"{stem}.{fc}.zero_points"}
            placed[fc] = {part: self._initializer(graph, names[part], dtype, offset, length, shape)
                          for part, (offset, length, shape, dtype) in entry.items()}
        biases = [node.inputs[i] if len(node.inputs) > i else None for i in (MOE_FC1_BIAS, MOE_FC2_BIAS)]
        biases = [self._materialize(graph, exprs[b], b) if b in exprs else b for b in biases]
        attributes = qmoe_attributes({a.name: a.value for a in node.attributes.values()},
                                     bits, block, self.experts)
        new = []
        router_weights = None
        if not attributes.get("normalize_routing_weights", 0):  # QMoE would renormalise the top-k
            new.append(ir.node("Softmax", [node.inputs[1]], {"axis": -1}, name=f"{node.name}_weights"))
            router_weights = new[-1].outputs[0]
        inputs = [node.inputs[0], node.inputs[1], placed["fc1"]["packed"], placed["fc1"]["scales"], biases[0],
                  placed["fc2"]["packed"], placed["fc2"]["scales"], biases[1], None, None, None,
                  placed["fc1"].get("zero_points"), placed["fc2"].get("zero_points"), None, router_weights]
        while inputs[-1] is None:
            inputs.pop()
        new.append(ir.node("QMoE", inputs, attributes, domain=MICROSOFT, name=f"{node.name}_int{bits}"))
        self._replace(graph, node, new)
        return True

    # -- writing --------------------------------------------------------------------------------
    def write(self, model: ir.Model, prefix: str, path: Path,
              progress: Callable[[int, int], None] | None = None) -> None:
        """Fold, quantize and write the weights of ``model`` (a built graph, with ``prefix``
        before the state-dict names), then save the graph as ``path``.
        ``progress(done, total)`` is called after each weight the graph reads."""
        graph = model.graph
        exprs, folded = _weight_expressions(graph, prefix)
        uses = [(node, i, v) for node in graph if node not in folded
                for i, v in enumerate(node.inputs) if v in exprs]
        plain = {}
        for node, _, value in uses:
            plain.setdefault(exprs[value], []).append(node)
        heads = head_matmuls(graph) if self.int4 is not None else set()
        kept_float = ((heads if not self.int4.head else set()) | router_matmuls(graph)
                      if self.int4 is not None else set())
        if self.int4 is not None and self.int4.eight_bit:
            self.eight_bit |= self._eight_bit_rows(graph, uses, exprs, heads)
        replaced: set[ir.Node] = set()
        if self.experts is not None:
            early = (early_layers([name for _, _, value in uses for name in _weight_names(exprs[value])])
                     if self.experts.early_in_8_bits else set())
            replaced |= {node for node in list(graph) if node.op_type == "MoE" and node.domain == MICROSOFT
                         and self._qmoe(graph, node, exprs, early)}
        for done, (node, index, value) in enumerate(uses, start=1):
            if progress is not None:
                progress(done, len(uses))
            if node not in replaced and self._write_use(graph, node, index, value, exprs[value],
                                                        kept_float, plain):
                replaced.add(node)
        _remove_unused(graph, folded, exprs)
        if any(node.domain == MICROSOFT for node in graph):
            model.opset_imports.setdefault(MICROSOFT, 1)
        self._externalize_constants(graph)
        ir.save(model, path)

    def _write_use(self, graph: ir.Graph, node: ir.Node, index: int, value: ir.Value, expr: Expr,
                   kept_float: set[ir.Node], plain: dict[Expr, list[ir.Node]]) -> bool:
        """Write the weight ``expr`` that ``node`` reads as its input ``index``: as quantized
        rows (int4's products and token embedding, the node replaced), as the matrix a
        transposed product reads when other nodes read it untransposed (``FusedMatMul``, the
        node replaced), else as its values; returns whether ``node`` was replaced."""
        matrix = value.shape is not None and len(value.shape) == 2
        if (self.int4 is not None and node.op_type == "MatMul" and node.domain == "" and index == 1
                and matrix and node not in kept_float):
            self._matmul_nbits(graph, node, expr)
        elif self._quantizable_gather(graph, node, value) and index == 0:
            self._gather_quantized(graph, node, expr)
        elif (node.op_type == "MatMul" and node.domain == "" and index == 1 and matrix
              and expr[0] == "transpose" and any(n is not node for n in plain.get(expr[1], []))):
            self._fused_transposed(graph, node, expr[1], value)
        else:
            node.replace_input_with(index, self._materialize(graph, expr, value))
            return False
        return True

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
