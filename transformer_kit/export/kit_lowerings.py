"""The kit's own modules written as ONNX: the embedder, the stacks, the output head, the sentence
and classifier heads, and the torch layers they hold (linear, embedding, norms, activations,
dropout); multi-head attention is :mod:`.attention_lowering`. Each function follows its module's
forward call for call, on graph values: x (batch, len, d_model); positions (batch, len) int64.

:func:`find` is what the graph builder asks for the lowering of an object that no registered
component's lowering writes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import onnx_ir as ir
from torch import nn

from transformer_kit.core.attention import MultiHeadAttention
from transformer_kit.core.embedding.heads import ClassifierHead, DenseActivation, SentenceHead
from transformer_kit.core.interfaces import AttentionInputs, PositionalEncoding
from transformer_kit.core.layer_lowerings import gelu_onnx, layer_norm_onnx, rms_norm_onnx, silu_onnx
from transformer_kit.core.masks import NoMask
from transformer_kit.core.stacks import Embedder, FeatureEmbedder, OutputHead, Stack
from transformer_kit.export.attention_lowering import declares, multi_head_attention_onnx, shape_of
from transformer_kit.export.graph_builder import FLOAT, GraphBuilder


# -- torch's layers --------------------------------------------------------------------------------
def linear_onnx(g: GraphBuilder, linear: nn.Linear, x: ir.Value) -> ir.Value:
    """x (..., in) -> (..., out)."""
    y = g.matmul_transposed(x, g.weight(linear, "weight"), linear.in_features, linear.out_features)
    if linear.bias is not None:
        y = g.shaped(g.op.Add(y, g.weight(linear, "bias")), y.shape, g.float_type)
    return y


def embedding_onnx(g: GraphBuilder, embedding: nn.Embedding, ids: ir.Value) -> ir.Value:
    """ids (batch, len) -> rows (batch, len, dim)."""
    rows = g.op.Gather(g.weight(embedding, "weight"), ids, axis=0)
    return g.shaped(rows, [*shape_of(ids), embedding.embedding_dim], g.float_type)


def _same(g: GraphBuilder, module: nn.Module, x: ir.Value) -> ir.Value:
    return x


def _elementwise(op: Callable[[GraphBuilder, ir.Value], ir.Value]) -> Callable[..., ir.Value]:
    def lowered(g: GraphBuilder, module: nn.Module, x: ir.Value) -> ir.Value:
        return g.shaped(op(g, x), x.shape, x.dtype)
    return lowered


def softmax_onnx(g: GraphBuilder, softmax: nn.Softmax, x: ir.Value) -> ir.Value:
    return g.shaped(g.op.Softmax(x, axis=softmax.dim if softmax.dim is not None else -1), x.shape, x.dtype)


# -- the model's parts -----------------------------------------------------------------------------
def embedder_onnx(g: GraphBuilder, embed: Embedder, ids: ir.Value, positions: ir.Value,
                  token_types: ir.Value | None = None) -> ir.Value:
    """ids, positions (batch, len) -> (batch, len, d_model)."""
    x = g.call(embed.token, ids)
    if embed.scale != 1.0:
        x = g.op.Mul(x, embed.scale)
    types = [] if token_types is None else [token_types]
    x = g.call(embed.positional, x, positions, *types, method="embed")
    if embed.norm is not None:
        x = g.call(embed.norm, x)
    return g.shaped(x, [*shape_of(ids), embed.token.embedding_dim], g.float_type)


def feature_embedder_onnx(g: GraphBuilder, embed: FeatureEmbedder, x: ir.Value,
                          positions: ir.Value) -> ir.Value:
    """The frontend's output x (batch, len, d_model) plus the encodings of positions (batch, len)."""
    return g.shaped(g.call(embed.positional, x, positions, method="embed"), x.shape, g.float_type)


def stack_onnx(g: GraphBuilder, stack: Stack, x: ir.Value, self_inputs: list[AttentionInputs],
               cross_inputs: AttentionInputs | None = None, caches: list | None = None) -> ir.Value:
    """x (batch, len, d_model) through every layer (each with its attention inputs and cache),
    then the final norm."""
    shape = x.shape
    for i, layer in enumerate(stack.layers):
        s, c = self_inputs[i], cross_inputs
        if caches is not None:
            s = replace(s, cache=caches[i])
            c = None if cross_inputs is None else replace(cross_inputs, cache=caches[i])
        x = g.shaped(g.call(layer, x, s, c), shape, g.float_type)
    if stack.final_norm is not None:
        x = g.shaped(g.call(stack.final_norm, x), shape, g.float_type)
    return x


def output_head_onnx(g: GraphBuilder, head: OutputHead, x: ir.Value) -> ir.Value:
    """x (..., d_model) -> logits (..., vocab), scaled and soft-capped as configured."""
    logits = linear_onnx(g, head, x)
    if head.scale is not None and head.scale != 1.0:
        logits = g.op.Mul(logits, head.scale)
    if head.softcap is not None:
        cap = g.constant(head.softcap)
        logits = g.op.Mul(g.op.Tanh(g.op.Div(logits, cap)), cap)
    return g.shaped(logits, [*shape_of(x)[:-1], head.out_features], g.float_type)


def dense_onnx(g: GraphBuilder, dense: DenseActivation, x: ir.Value) -> ir.Value:
    """(batch, in) -> (batch, out)."""
    return g.call(dense.activation, g.linear(dense.linear, x))


def sentence_head_onnx(g: GraphBuilder, head: SentenceHead, hidden: ir.Value, real: ir.Value) -> ir.Value:
    """hidden (batch, len, d_model), real (batch, len) bool -> (batch, dim): pooled, through the
    dense layers, L2-normalised (x / max(|x|, 1e-12)) when configured."""
    batch, width = shape_of(hidden)[0], shape_of(hidden)[-1]
    x = g.shaped(g.call(head.pooling, hidden, real), [batch, width], g.float_type)
    for layer in head.dense:
        x = g.call(layer, x)
    if head.normalize:
        x = g.op.Div(x, g.op.Max(g.op.ReduceL2(x, [-1], keepdims=1), 1e-12))
    return x


def classifier_onnx(g: GraphBuilder, head: ClassifierHead, hidden: ir.Value) -> tuple[ir.Value, ir.Value]:
    """hidden (batch, len, d_model) -> logits, scores (batch, num_labels)."""
    first = g.op.Gather(hidden, g.constant(0), axis=1)
    pooled = g.call(head.pooler_activation, g.linear(head.pooler, first))
    logits = g.linear(head.out, pooled)
    wide = logits if g.float_type == FLOAT else g.op.Cast(logits, to=FLOAT)
    scores = g.call(head.score, wide, path=g.path_of(head.score, "classifier.score"))
    return logits, scores if g.float_type == FLOAT else g.op.Cast(scores, to=g.float_type)


# -- finding them --------------------------------------------------------------------------------
_BY_TYPE: dict[tuple[type, str], Callable[..., Any]] = {
    (nn.Linear, "forward"): linear_onnx,
    (nn.Embedding, "forward"): embedding_onnx,
    (nn.Dropout, "forward"): _same,
    (nn.Identity, "forward"): _same,
    (nn.ReLU, "forward"): _elementwise(lambda g, x: g.op.Relu(x)),
    (nn.SiLU, "forward"): _elementwise(silu_onnx),
    (nn.Tanh, "forward"): _elementwise(lambda g, x: g.op.Tanh(x)),
    (nn.Sigmoid, "forward"): _elementwise(lambda g, x: g.op.Sigmoid(x)),
    (nn.Softmax, "forward"): softmax_onnx,
    (nn.LayerNorm, "forward"): layer_norm_onnx,
    (nn.RMSNorm, "forward"): rms_norm_onnx,
    (MultiHeadAttention, "forward"): multi_head_attention_onnx,
    (Embedder, "forward"): embedder_onnx,
    (FeatureEmbedder, "forward"): feature_embedder_onnx,
    (Stack, "forward"): stack_onnx,
    (OutputHead, "forward"): output_head_onnx,
    (DenseActivation, "forward"): dense_onnx,
    (SentenceHead, "forward"): sentence_head_onnx,
    (ClassifierHead, "forward"): classifier_onnx,
    (NoMask, "forward"): lambda g, mask, q_positions, k_positions: None,
}

#: A positional encoding's points it does not act at (the interface's inherited methods).
_INHERITED: dict[str, Callable[..., Any]] = {
    "embed": lambda g, positional, x, positions: x,
    "rotate": lambda g, positional, x, positions: x,
    "score_bias": lambda g, positional, q_positions, k_positions: None,
}


def gelu_module_onnx(g: GraphBuilder, gelu: nn.GELU, x: ir.Value) -> ir.Value:
    return g.shaped(gelu_onnx(g, x, gelu.approximate), x.shape, x.dtype)


_BY_TYPE[nn.GELU, "forward"] = gelu_module_onnx


def _gate_up_contract(ff: nn.Module) -> bool:
    """Whether a feed-forward module meets the ``gate_up`` lowering's contract: ``nn.Linear``
    ``gate`` and ``up`` over one input (biases alike) and ``forward(x) == gated(gate(x), up(x))``."""
    gate, up = getattr(ff, "gate", None), getattr(ff, "up", None)
    return (isinstance(gate, nn.Linear) and isinstance(up, nn.Linear)
            and gate.in_features == up.in_features and (gate.bias is None) == (up.bias is None)
            and callable(getattr(ff, "gated", None)))


def declared_gate_up_onnx(g: GraphBuilder, ff: nn.Module, x: ir.Value) -> ir.Value:
    """A feed-forward that declares ``gate_up`` but brings no lowering: gate and up as one
    product (in a generating model), then its own ``gated`` (traced alone)."""
    gate, up = g.linears([ff.gate, ff.up], x)
    return g.call(ff, gate, up, method="gated")


def find(obj: object, method: str) -> Callable[..., Any] | None:
    """The kit's lowering of ``obj.<method>``: by ``obj``'s exact type (a subclass may compute
    something else), a positional encoding's inherited no-op, or the packed product of a
    feed-forward declaring ``gate_up``; None when the kit has none."""
    found = _BY_TYPE.get((type(obj), method))
    if found is not None:
        return found
    if method == "forward" and declares(obj, "gate_up") and _gate_up_contract(obj):
        return declared_gate_up_onnx
    if isinstance(obj, PositionalEncoding) and method in _INHERITED and (
            getattr(type(obj), method) is getattr(PositionalEncoding, method)):
        return _INHERITED[method]
    return None
