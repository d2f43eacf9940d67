"""Activations of the int8 export quantized row by row, so a row's product never depends on the
other rows of its batch.

onnxruntime's dynamic quantizer writes ``DynamicQuantizeLinear`` before each ``MatMulInteger``:
ONE scale and zero point for the whole activation tensor, from its minimum and maximum over every
row (and the padding) of the batch. A prompt then rounds to other integers alone than beside a
prompt with larger activations: greedy decoding gave other tokens in a batch than alone.

:func:`quantize_rows` replaces each ``DynamicQuantizeLinear`` with its row-wise form: each row
(the last axis: one token's features) gets its own scale ``max|x| / 127`` and the integers
``round(x / scale) + 128`` as uint8 with the fixed zero point 128 (``MatMulInteger`` takes a
single zero point for its input; symmetric rows need no more). Every operation is elementwise or
a maximum along the row, and the integer product is exact, so a row's output is bit for bit the
same alone or in any batch. The weights keep their per-column int8 scales and 7-bit range.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

#: The integer step of the row's largest magnitude (symmetric rows: -127..127 around 128).
LEVELS = 127.0
#: Zero point of every row: uint8 integers 1..255 hold -127..127.
ZERO_POINT = 128
#: Scale floor: an all-zero row quantizes to zeros instead of dividing by 0.
TINY = 1e-30


def _constants(prefix: str, rounded: bool) -> list[TensorProto]:
    """The scalars the rows' nodes read; ``rounded``: those of the Div/Round/Clip form too."""
    values = {"levels": np.float32(LEVELS), "tiny": np.float32(TINY),
              "zero_point": np.uint8(ZERO_POINT), "last_axis": np.array([-1], np.int64)}
    if rounded:
        values |= {"zero_float": np.float32(ZERO_POINT), "low": np.float32(0.0),
                   "high": np.float32(255.0)}
    return [numpy_helper.from_array(np.array(v), prefix + k) for k, v in values.items()]


def _row_nodes(dql: onnx.NodeProto, prefix: str, opset: int, width: int | None) -> list[onnx.NodeProto]:
    """The nodes computing ``dql``'s three outputs row by row: uint8 (..., K), scale (..., 1),
    zero point (a uint8 scalar, 128). From opset 21 with the row's width ``width`` known, one
    blocked ``QuantizeLinear`` (a block = the whole row) rounds and shifts; else Div, Round, Add,
    Clip and Cast do (the same integers)."""
    x = dql.input[0]
    quantized, scale, zero_point = dql.output
    t = f"{dql.name or x}/rows/"
    reduce = (helper.make_node("ReduceMax", [t + "abs", f"{prefix}last_axis"], [t + "max"],
                               keepdims=1, name=t + "ReduceMax") if opset >= 18 else
              helper.make_node("ReduceMax", [t + "abs"], [t + "max"], axes=[-1], keepdims=1,
                               name=t + "ReduceMax"))
    nodes = [
        helper.make_node("Abs", [x], [t + "abs"], name=t + "Abs"),
        reduce,
        helper.make_node("Max", [t + "max", f"{prefix}tiny"], [t + "floor"], name=t + "Max"),
        helper.make_node("Div", [t + "floor", f"{prefix}levels"], [scale], name=t + "Scale"),
        helper.make_node("Identity", [f"{prefix}zero_point"], [zero_point], name=t + "ZeroPoint"),
    ]
    if opset >= 21 and width:
        return [
            *nodes,
            helper.make_node("Shape", [scale], [t + "rows"], name=t + "Shape"),
            helper.make_node("Expand", [f"{prefix}zero_point", t + "rows"], [t + "zero_points"],
                             name=t + "Expand"),
            helper.make_node("QuantizeLinear", [x, scale, t + "zero_points"], [quantized], axis=-1,
                             block_size=width, name=t + "QuantizeLinear"),
        ]
    return [
        *nodes,
        helper.make_node("Div", [x, scale], [t + "steps"], name=t + "Div"),
        helper.make_node("Round", [t + "steps"], [t + "round"], name=t + "Round"),
        helper.make_node("Add", [t + "round", f"{prefix}zero_float"], [t + "shifted"], name=t + "Add"),
        helper.make_node("Clip", [t + "shifted", f"{prefix}low", f"{prefix}high"], [t + "clipped"],
                         name=t + "Clip"),
        helper.make_node("Cast", [t + "clipped"], [quantized], to=TensorProto.UINT8, name=t + "Cast"),
    ]


def _scale_after(nodes: list[onnx.NodeProto], scales: set[str]) -> list[onnx.NodeProto]:
    """The quantizer multiplies the two scales first, ``Mul(x_scale, w_scale)``, then the cast
    product by it: onnxruntime fuses that pattern into ``MatMulIntegerToFloat``, whose kernel
    takes the input's scale as one number (only the first row's would count). Here the cast
    product is multiplied by the weight's scales, then by the row's: no fused pattern."""
    products = {n.output[0]: n for n in nodes if n.op_type == "Mul" and set(n.input) & scales}
    for node in nodes:  # a product read by anything but a Mul stays as it is
        if node.op_type != "Mul":
            for name in set(node.input) & set(products):
                del products[name]
    out = []
    for node in nodes:
        if node.output[0] in products:
            continue
        hit = [i for i in node.input if i in products]
        if node.op_type != "Mul" or not hit:
            out.append(node)
            continue
        product = products[hit[0]]
        row = next(i for i in product.input if i in scales)
        weight = next(i for i in product.input if i != row)
        other = next(i for i in node.input if i != hit[0])
        partial = node.output[0] + "/weight_scaled"
        out.append(helper.make_node("Mul", [other, weight], [partial], name=node.name + "/weight"))
        out.append(helper.make_node("Mul", [partial, row], list(node.output), name=node.name + "/row"))
    return out


def quantize_rows(model: onnx.ModelProto) -> int:
    """Rewrite ``model`` in place: every ``DynamicQuantizeLinear`` quantizes row by row (module
    docstring). Returns how many were rewritten."""
    graph = model.graph
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    prefix = "row_quantization/"
    dims = {t.name: t.dims for t in graph.initializer}
    widths = {n.input[0]: dims[n.input[1]][0] for n in graph.node  # K of the weight it meets
              if n.op_type == "MatMulInteger" and len(dims.get(n.input[1], ())) == 2}
    nodes, count = [], 0
    for node in graph.node:
        if node.op_type == "DynamicQuantizeLinear" and node.domain in ("", "ai.onnx"):
            nodes.extend(_row_nodes(node, prefix, opset, widths.get(node.output[0])))
            count += 1
        else:
            nodes.append(node)
    if count:
        rewritten = {out for node in graph.node if node.op_type == "DynamicQuantizeLinear"
                     for out in node.output}
        kept = [v for v in graph.value_info if v.name not in rewritten]  # scales now (..., 1)
        del graph.value_info[:]
        graph.value_info.extend(kept)
        scales = {n.output[1] for n in graph.node if n.op_type == "DynamicQuantizeLinear"}
        nodes = _scale_after(nodes, scales)
        del graph.node[:]
        graph.node.extend(nodes)
        graph.initializer.extend(_constants(prefix, any(n.op_type == "Round" for n in nodes)))
    return count
