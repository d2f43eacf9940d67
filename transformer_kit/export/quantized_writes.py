"""The quantized side of :class:`~transformer_kit.export.weight_writer.WeightWriter`: rows of a
weight written once in 4-bit blocks (8-bit for the roles ``Int4.eight_bit`` names, or a GGUF
file's own blocks), and ``MatMul`` / the token embedding's ``Gather`` rewritten to read them
(``MatMulNBits``, ``GatherBlockQuantized``). A mixin: it uses the writer's file, placement and
initializers (``file``, ``quantized``, ``int4``, ``eight_bit``, ``file_blocks``, ``evaluate``,
``_initializer``, ``_replace``, ``_fused_transposed``, ``_quantizable_gather``).
"""

from __future__ import annotations

import re

import numpy as np
import onnx_ir as ir

from transformer_kit.export.int4_nodes import (
    QuantizedRows,
    dequantize_rows,
    gather_offset_nodes,
    offset_nodes,
    quantize_rows,
)
from transformer_kit.export.weight_exprs import Expr, name_of, simplify

MICROSOFT = "com.microsoft"


def _weight_names(expr: Expr) -> list[str]:
    """The state-dict names of the weights ``expr`` reads."""
    if expr[0] == "weight":
        return [expr[1]]
    if expr[0] == "transpose":
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


class QuantizedWrites:
    """Writing and reading quantized rows (see the module's docstring)."""

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
