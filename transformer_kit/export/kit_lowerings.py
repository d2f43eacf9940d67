"""The kit's own modules written as ONNX: multi-head attention (one ONNX ``Attention`` op per layer
where the kernel declares it), the embedder, the stacks, the output head, the sentence and
classifier heads, and the torch layers they hold (linear, embedding, norms, activations,
dropout). Each function follows its module's forward call for call, on graph values:
x (batch, len, d_model); q, k, v (batch, heads, len, head_dim); masks (batch, 1, q_len | 1,
k_len) bool; positions (batch, len) int64.

:func:`find` is what the graph builder asks for the lowering of an object that no registered
component's lowering writes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import onnx_ir as ir
from torch import nn

from transformer_kit.attention import MultiHeadAttention
from transformer_kit.embedding.heads import ClassifierHead, DenseActivation, SentenceHead
from transformer_kit.export.graph_builder import FLOAT, GraphBuilder
from transformer_kit.interfaces import AttentionInputs, PositionalEncoding
from transformer_kit.masks import NoMask
from transformer_kit.plugins.feedforward import gelu_onnx, silu_onnx
from transformer_kit.plugins.masks import no_mask_onnx
from transformer_kit.plugins.norms import UnitOffsetRMSNorm, layer_norm_onnx, rms_norm_onnx
from transformer_kit.plugins.positional import no_positions_onnx, rotary_cos_sin
from transformer_kit.registry_entries import component_of
from transformer_kit.stacks import Embedder, OutputHead, Stack

#: The first opset with ONNX's ``Attention`` and ``RotaryEmbedding`` ops.
PACKED_ATTENTION_OPSET = 23


def _shape(value: ir.Value) -> list:
    return list(value.shape) if value.shape is not None else [None]


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
    return g.shaped(rows, [*_shape(ids), embedding.embedding_dim], g.float_type)


def _same(g: GraphBuilder, module: nn.Module, x: ir.Value) -> ir.Value:
    return x


def _elementwise(op: Callable[[GraphBuilder, ir.Value], ir.Value]) -> Callable[..., ir.Value]:
    def lowered(g: GraphBuilder, module: nn.Module, x: ir.Value) -> ir.Value:
        return g.shaped(op(g, x), x.shape, x.dtype)
    return lowered


def softmax_onnx(g: GraphBuilder, softmax: nn.Softmax, x: ir.Value) -> ir.Value:
    return g.shaped(g.op.Softmax(x, axis=softmax.dim if softmax.dim is not None else -1), x.shape, x.dtype)


# -- attention -------------------------------------------------------------------------------------
def split_heads(g: GraphBuilder, x: ir.Value, heads: int, head_dim: int) -> ir.Value:
    """(batch, len, heads * head_dim) -> (batch, heads, len, head_dim)."""
    shape = _shape(x)
    split = g.op.Transpose(g.op.Reshape(x, [0, 0, heads, head_dim]), perm=[0, 2, 1, 3])
    return g.shaped(split, [shape[0], heads, shape[1] if len(shape) > 1 else None, head_dim], g.float_type)


def repeat_kv_heads(g: GraphBuilder, x: ir.Value, groups: int) -> ir.Value:
    """(batch, kv_heads, len, dim) -> (batch, kv_heads * groups, len, dim), each head repeated."""
    if groups == 1:
        return x
    batch, heads, length, dim = _shape(x)
    repeated = g.op.Expand(g.op.Unsqueeze(x, [2]), [1, 1, groups, 1, 1])
    return g.shaped(g.op.Reshape(repeated, [0, heads * groups, -1, dim]),
                    [batch, heads * groups, length, dim], x.dtype)


def keys_values(g: GraphBuilder, attention: MultiHeadAttention,
                source: ir.Value) -> tuple[ir.Value, ir.Value]:
    """source (batch, len, d_model) -> keys, values (batch, kv_heads, len, head_dim)."""
    with g.scope(g.path_of(attention, "attention")):
        heads, dim = attention.num_kv_heads, attention.head_dim
        return (split_heads(g, g.linear(attention.k_proj, source), heads, dim),
                split_heads(g, g.linear(attention.v_proj, source), heads, dim))


def _rotates(positional: PositionalEncoding | None) -> bool:
    return positional is not None and type(positional).rotate is not PositionalEncoding.rotate


def _declares(obj: object, lowering: str) -> bool:
    entry = component_of(obj)
    return entry is not None and lowering in entry.component.lowerings


def packs_attention(g: GraphBuilder, attention: MultiHeadAttention, inputs: AttentionInputs) -> bool:
    """Whether self-attention is one ONNX ``Attention`` op: the kernel declares the
    ``attention`` lowering, no score bias, and q and k turn (if at all) by a positional encoding
    that declares ``rotary`` (one ``RotaryEmbedding`` op each)."""
    return (not attention.is_cross and g.opset >= PACKED_ATTENTION_OPSET and inputs.bias is None
            and _declares(attention.kernel, "attention")
            and (not _rotates(inputs.positional) or _declares(inputs.positional, "rotary")))


def multi_head_attention_onnx(g: GraphBuilder, attention: MultiHeadAttention, x: ir.Value,
                              inputs: AttentionInputs) -> ir.Value:
    """x (batch, q_len, d_model) -> (batch, q_len, d_model); the cache of ``inputs`` (graph
    values) is replaced by past + new keys and values, as the module does."""
    if packs_attention(g, attention, inputs):
        return _packed_attention(g, attention, x, inputs)
    heads, kv_heads, dim = attention.num_heads, attention.num_kv_heads, attention.head_dim
    batch, q_len = _shape(x)[:2]
    cache = inputs.cache
    if attention.is_cross:
        q = split_heads(g, g.linear(attention.q_proj, x), heads, dim)
        if cache is not None and cache.cross_key is not None:
            k, v = cache.cross_key, cache.cross_value
        else:
            k, v = keys_values(g, attention, inputs.memory)
            if cache is not None:
                cache.cross_key, cache.cross_value = k, v
    else:  # three products (the packed path below reads them as one)
        q, k, v = (g.linear(p, x) for p in (attention.q_proj, attention.k_proj, attention.v_proj))
        if attention.qk_norm is not None:
            q, k = g.call(attention.qk_norm, q, k)
        q, k, v = (split_heads(g, t, n, dim) for t, n in ((q, heads), (k, kv_heads), (v, kv_heads)))
        if inputs.positional is not None:
            q = g.shaped(g.call(inputs.positional, q, inputs.q_positions, method="rotate"), q.shape, q.dtype)
            k = g.shaped(g.call(inputs.positional, k, inputs.q_positions, method="rotate"), k.shape, k.dtype)
        if cache is not None:
            k_len = _shape(inputs.k_positions)[-1] if inputs.k_positions is not None else None
            k = g.shaped(g.op.Concat(cache.key, k, axis=2), [batch, kv_heads, k_len, dim], g.float_type)
            v = g.shaped(g.op.Concat(cache.value, v, axis=2), [batch, kv_heads, k_len, dim], g.float_type)
            cache.key, cache.value = k, v
    groups = heads // kv_heads
    k, v = repeat_kv_heads(g, k, groups), repeat_kv_heads(g, v, groups)
    attended = g.call(attention.kernel, q, k, v, inputs.mask, inputs.bias)
    g.shaped(attended, [batch, heads, q_len, dim], g.float_type)
    merged = g.op.Reshape(g.op.Transpose(attended, perm=[0, 2, 1, 3]), [0, 0, heads * dim])
    return g.linear(attention.o_proj, g.shaped(merged, [batch, q_len, heads * dim], g.float_type))


def _packed_attention(g: GraphBuilder, attention: MultiHeadAttention, x: ir.Value,
                      inputs: AttentionInputs) -> ir.Value:
    """Self-attention as one ``Attention`` op on (batch, len, heads * head_dim) tensors, the
    cache concatenated inside it; rotary as ``RotaryEmbedding`` ops on the packed heads."""
    heads, kv_heads, dim = attention.num_heads, attention.num_kv_heads, attention.head_dim
    q, k, v = g.linears([attention.q_proj, attention.k_proj, attention.v_proj], x)
    if attention.qk_norm is not None:
        q, k = g.call(attention.qk_norm, q, k)
    positional = inputs.positional
    if _rotates(positional):
        cos, sin = rotary_cos_sin(g, positional, inputs.q_positions)
        rotary_dim = positional.rotary_dim
        q = g.op.RotaryEmbedding(q, cos, sin, interleaved=0, num_heads=heads, rotary_embedding_dim=rotary_dim)
        k = g.op.RotaryEmbedding(k, cos, sin, interleaved=0, num_heads=kv_heads,
                                 rotary_embedding_dim=rotary_dim)
    mask, has_key = inputs.mask, None
    if mask is not None:
        has_key = g.op.Cast(g.op.ReduceMax(g.op.Cast(mask, to=ir.DataType.INT32), [-1], keepdims=1),
                            to=g.BOOL)  # (batch, 1, q_len | 1, 1)
        mask = g.op.Or(mask, g.op.Not(has_key))  # no row without a key: its output is zeroed below
        q_len = g.op.Shape(inputs.q_positions, start=1, end=2)  # the same in every layer
        mask = g.op.Expand(mask, g.op.Concat([1, 1], q_len, [1], axis=0))
    scale = attention.kernel.scale if attention.kernel.scale is not None else dim ** -0.5
    softcap = getattr(attention.kernel, "softcap", None) or 0.0
    cache = inputs.cache
    attributes = {"q_num_heads": heads, "kv_num_heads": kv_heads, "scale": float(scale),
                  "softcap": float(softcap)}
    if cache is None:
        out = g.op.Attention(q, k, v, mask, **attributes)
    else:
        out, cache.key, cache.value = g.op.Attention(q, k, v, mask, cache.key, cache.value, _outputs=3,
                                                     **attributes)
        # a cached call (a decoding step) leaves a padding query's output as it is: nothing real
        # attends to a padding key, and a step's logits are real positions'
    if has_key is not None and cache is None:
        out = g.op.Where(g.op.Not(g.op.Squeeze(has_key, [1])), g.constant(0.0), out)
    batch, q_len = _shape(x)[:2]
    return g.linear(attention.o_proj, g.shaped(out, [batch, q_len, heads * dim], g.float_type))


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
    return g.shaped(x, [*_shape(ids), embed.token.embedding_dim], g.float_type)


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
    return g.shaped(logits, [*_shape(x)[:-1], head.out_features], g.float_type)


def dense_onnx(g: GraphBuilder, dense: DenseActivation, x: ir.Value) -> ir.Value:
    """(batch, in) -> (batch, out)."""
    return g.call(dense.activation, g.linear(dense.linear, x))


def sentence_head_onnx(g: GraphBuilder, head: SentenceHead, hidden: ir.Value, keep: ir.Value) -> ir.Value:
    """hidden (batch, len, d_model), keep (batch, len) bool -> (batch, dim): pooled, through the
    dense layers, L2-normalised (x / max(|x|, 1e-12)) when configured."""
    x = g.shaped(g.call(head.pooling, hidden, keep), [_shape(hidden)[0], _shape(hidden)[-1]], g.float_type)
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
    (UnitOffsetRMSNorm, "forward"): rms_norm_onnx,
    (MultiHeadAttention, "forward"): multi_head_attention_onnx,
    (Embedder, "forward"): embedder_onnx,
    (Stack, "forward"): stack_onnx,
    (OutputHead, "forward"): output_head_onnx,
    (DenseActivation, "forward"): dense_onnx,
    (SentenceHead, "forward"): sentence_head_onnx,
    (ClassifierHead, "forward"): classifier_onnx,
    (NoMask, "forward"): no_mask_onnx,
}

#: A positional encoding's points it does not act at (the interface's inherited methods).
_INHERITED: dict[str, Callable[..., Any]] = {
    "embed": no_positions_onnx,
    "rotate": lambda g, positional, x, positions: x,
    "score_bias": lambda g, positional, q_positions, k_positions: None,
}


def gelu_module_onnx(g: GraphBuilder, gelu: nn.GELU, x: ir.Value) -> ir.Value:
    return g.shaped(gelu_onnx(g, x, gelu.approximate), x.shape, x.dtype)


_BY_TYPE[nn.GELU, "forward"] = gelu_module_onnx


def find(obj: object, method: str) -> Callable[..., Any] | None:
    """The kit's lowering of ``obj.<method>``: by ``obj``'s exact type (a subclass may compute
    something else), or a positional encoding's inherited no-op; None when the kit has none."""
    found = _BY_TYPE.get((type(obj), method))
    if found is not None:
        return found
    if isinstance(obj, PositionalEncoding) and method in _INHERITED and (
            getattr(type(obj), method) is getattr(PositionalEncoding, method)):
        return _INHERITED[method]
    return None
