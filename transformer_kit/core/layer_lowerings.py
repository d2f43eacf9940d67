"""The ONNX forms the export's own lowerings and the built-in components' share, written through
the :class:`~transformer_kit.core.graph_writer.GraphWriter` protocol: torch's norms and
activations, and the cos/sin tables of an encoding that declares the ``rotary`` lowering."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import nn

from transformer_kit.core.graph_writer import GraphWriter
from transformer_kit.core.interfaces import PositionalEncoding

if TYPE_CHECKING:
    from onnx_ir import Value


def layer_norm_onnx(g: GraphWriter, norm: nn.LayerNorm, x: Value) -> Value:
    """LayerNorm over the last axis: one ``LayerNormalization`` op (statistics in float32)."""
    scale = (g.weight(norm, "weight") if norm.weight is not None
             else g.constant(torch.ones(norm.normalized_shape[-1]).numpy(), g.float_type))
    bias = g.weight(norm, "bias") if norm.bias is not None else None
    return g.op.LayerNormalization(x, scale, bias, epsilon=norm.eps, axis=-1)


def rms_norm_onnx(g: GraphWriter, norm: nn.RMSNorm, x: Value, unit_offset: bool = False) -> Value:
    """RMSNorm over the last axis: one ``RMSNormalization`` op from opset 23 (float32 statistics;
    with ``unit_offset``, Gemma's (1 + weight), in float32 as Gemma computes it), its formula
    before."""
    eps = norm.eps if norm.eps is not None else float(torch.finfo(torch.float16 if g.float_type == g.FLOAT16
                                                                  else torch.float32).eps)
    offset = unit_offset
    half = g.float_type != g.FLOAT
    scale = g.weight(norm, "weight", g.FLOAT if offset else None)
    if offset:
        scale = g.op.Add(scale, g.constant(1.0, g.FLOAT))
        if half:
            x = g.op.Cast(x, to=g.FLOAT)
    if g.opset >= 23:
        y = g.op.RMSNormalization(x, scale, epsilon=eps, axis=-1)
    else:
        wide = g.op.Cast(x, to=g.FLOAT) if half and not offset else x
        mean = g.op.ReduceMean(g.op.Mul(wide, wide), [-1], keepdims=1)
        y = g.op.Div(wide, g.op.Sqrt(g.op.Add(mean, g.constant(eps, g.FLOAT))))
        y = g.op.Mul(y if not half or offset else g.op.Cast(y, to=g.float_type), scale)
    return g.op.Cast(y, to=g.float_type) if offset and half else y


def gelu_onnx(g: GraphWriter, x: Value, approximate: str = "none") -> Value:
    """GELU of x: one ``Gelu`` op from opset 20; before it, its formula (erf, or tanh's)."""
    if g.opset >= 20:
        return g.op.Gelu(x, approximate=approximate)
    if approximate == "tanh":
        inner = g.op.Mul(g.op.Add(x, g.op.Mul(g.op.Mul(g.op.Mul(x, x), x), 0.044715)),
                         math.sqrt(2.0 / math.pi))
        return g.op.Mul(g.op.Mul(x, 0.5), g.op.Add(g.op.Tanh(inner), 1.0))
    return g.op.Mul(g.op.Mul(x, 0.5), g.op.Add(g.op.Erf(g.op.Mul(x, 1.0 / math.sqrt(2.0))), 1.0))


def silu_onnx(g: GraphWriter, x: Value) -> Value:
    """SiLU (swish) of x: x * sigmoid(x)."""
    return g.op.Mul(x, g.op.Sigmoid(x))


def rotary_cos_sin(g: GraphWriter, positional: PositionalEncoding, positions: Value) -> tuple[Value, Value]:
    """cos, sin (batch, len, rotary_dim / 2) in the activations' type of ``positions`` (batch,
    len) times the encoding's ``inv_freq`` (the ``rotary`` lowering's contract), computed in
    float32: with longrope's long frequencies for a call whose positions pass its ``long_from`` and
    the ``attention_factor`` of yarn and longrope when the encoding has them."""
    scaling = positional.rotary_scaling()
    inv_freq = g.weight(positional, "inv_freq", g.FLOAT)
    if scaling.long_from is not None:
        longest = g.op.Add(g.op.ReduceMax(positions, keepdims=0), [1])
        inv_freq = g.op.Where(g.op.Greater(longest, [scaling.long_from]),
                              g.weight(positional, "long_inv_freq", g.FLOAT), inv_freq)
    angles = g.op.Mul(g.op.Unsqueeze(g.op.Cast(positions, to=g.FLOAT), [-1]), inv_freq)
    cos, sin = g.op.Cos(angles), g.op.Sin(angles)
    factor = scaling.attention_factor
    if factor != 1.0:
        cos, sin = (g.op.Mul(t, g.constant(factor, g.FLOAT)) for t in (cos, sin))
    if g.float_type != g.FLOAT:
        cos, sin = g.op.Cast(cos, to=g.float_type), g.op.Cast(sin, to=g.float_type)
    return cos, sin
