"""Multi-head attention written as ONNX: the projections, q/k norms, rotation, key/value cache,
grouped KV heads and the kernel (its own lowering), as ``MultiHeadAttention.forward`` computes
them; or, where the kernel declares the ``attention`` lowering, one ONNX ``Attention`` op per
layer on packed heads (batch, len, heads * head_dim) with the cache concatenated inside it and
rotary positions as ``RotaryEmbedding`` ops; or, in a step graph over one cache buffer shared
by past and present (``g.cache_lengths`` set), onnxruntime's ``GroupQueryAttention`` writing
the new keys and values into the buffer in place, the mask's ``causal`` lowering applied by it.

Shapes: x (batch, len, d_model); q, k, v (batch, heads, len, head_dim); masks (batch, 1,
q_len | 1, k_len) bool; caches (batch, kv_heads, past, head_dim).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from transformer_kit.core.attention import MultiHeadAttention
from transformer_kit.core.interfaces import AttentionInputs, AttentionMask, LayerCache, PositionalEncoding
from transformer_kit.core.layer_lowerings import rotary_cos_sin
from transformer_kit.core.registry_entries import component_of
from transformer_kit.export.graph_builder import FLOAT, GraphBuilder

#: The first opset with ONNX's ``Attention`` and ``RotaryEmbedding`` ops.
PACKED_ATTENTION_OPSET = 23


def shape_of(value: ir.Value) -> list:
    """``value``'s recorded shape as a list ([None] when unknown)."""
    return list(value.shape) if value.shape is not None else [None]


def split_heads(g: GraphBuilder, x: ir.Value, heads: int, head_dim: int) -> ir.Value:
    """(batch, len, heads * head_dim) -> (batch, heads, len, head_dim)."""
    shape = shape_of(x)
    split = g.op.Transpose(g.op.Reshape(x, [0, 0, heads, head_dim]), perm=[0, 2, 1, 3])
    return g.shaped(split, [shape[0], heads, shape[1] if len(shape) > 1 else None, head_dim], g.float_type)


def repeat_kv_heads(g: GraphBuilder, x: ir.Value, groups: int) -> ir.Value:
    """(batch, kv_heads, len, dim) -> (batch, kv_heads * groups, len, dim), each head repeated."""
    if groups == 1:
        return x
    batch, heads, length, dim = shape_of(x)
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


def declares(obj: object, lowering: str) -> bool:
    """Whether the component that made ``obj`` declares ``lowering`` (``Component.lowerings``)."""
    entry = component_of(obj)
    return entry is not None and lowering in entry.component.lowerings


def packs_attention(g: GraphBuilder, attention: MultiHeadAttention, inputs: AttentionInputs) -> bool:
    """Whether self-attention is one ONNX ``Attention`` op: the kernel declares the
    ``attention`` lowering and has no sinks (which the op lacks), no score bias, and q and k
    turn (if at all) by a positional encoding that declares ``rotary`` (one ``RotaryEmbedding``
    op each)."""
    return (not attention.is_cross and g.opset >= PACKED_ATTENTION_OPSET and inputs.bias is None
            and declares(attention.kernel, "attention")
            and attention.kernel.sink_logits() is None
            and (not _rotates(inputs.positional) or declares(inputs.positional, "rotary")))


def shares_buffer(attention: MultiHeadAttention, positional: PositionalEncoding,
                  mask: AttentionMask) -> bool:
    """Whether self-attention can run over one cache buffer shared by past and present
    (``GroupQueryAttention``): it packs (as :func:`packs_attention`, with no score bias at all)
    and its mask declares the ``causal`` lowering."""
    no_bias = type(positional).score_bias is PositionalEncoding.score_bias
    return (not attention.is_cross and no_bias and declares(mask, "causal")
            and declares(attention.kernel, "attention")
            and attention.kernel.sink_logits() is None
            and (not _rotates(positional) or declares(positional, "rotary")))


def multi_head_attention_onnx(g: GraphBuilder, attention: MultiHeadAttention, x: ir.Value,
                              inputs: AttentionInputs) -> ir.Value:
    """x (batch, q_len, d_model) -> (batch, q_len, d_model); the cache of ``inputs`` (graph
    values) is replaced by past + new keys and values, as the module does."""
    if packs_attention(g, attention, inputs):
        return _packed_attention(g, attention, x, inputs)
    heads, kv_heads, dim = attention.num_heads, attention.num_kv_heads, attention.head_dim
    batch, q_len = shape_of(x)[:2]
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
            k_len = shape_of(inputs.k_positions)[-1] if inputs.k_positions is not None else None
            k = g.shaped(g.op.Concat(cache.key, k, axis=2), [batch, kv_heads, k_len, dim], g.float_type)
            v = g.shaped(g.op.Concat(cache.value, v, axis=2), [batch, kv_heads, k_len, dim], g.float_type)
            cache.key, cache.value = k, v
    groups = heads // kv_heads
    k, v = repeat_kv_heads(g, k, groups), repeat_kv_heads(g, v, groups)
    if inputs.weights is not None and inputs.weights.wants(attention):
        inputs.weights.record(attention, probabilities(g, attention, q, k, inputs))
    attended = g.call(attention.kernel, q, k, v, inputs.mask, inputs.bias)
    g.shaped(attended, [batch, heads, q_len, dim], g.float_type)
    merged = g.op.Reshape(g.op.Transpose(attended, perm=[0, 2, 1, 3]), [0, 0, heads * dim])
    return g.linear(attention.o_proj, g.shaped(merged, [batch, q_len, heads * dim], g.float_type))


def probabilities(g: GraphBuilder, attention: MultiHeadAttention, q: ir.Value, k: ir.Value,
                  inputs: AttentionInputs) -> ir.Value:
    """``MultiHeadAttention.probabilities``: softmax of the kernel's scaled (and soft-capped)
    scores of q (batch, heads, q_len, head_dim) over k (batch, heads, k_len, head_dim) under
    the mask and bias, (batch, heads, q_len, k_len) float32 (a masked key gets 0)."""
    kernel = attention.kernel
    scale = kernel.scale if getattr(kernel, "scale", None) is not None else attention.head_dim ** -0.5
    with g.scope(g.path_of(attention, "attention") + ".probabilities"):
        if g.float_type != FLOAT:
            q, k = g.op.Cast(q, to=FLOAT), g.op.Cast(k, to=FLOAT)
        scores = g.op.Mul(g.op.MatMul(q, g.op.Transpose(k, perm=[0, 1, 3, 2])),
                          g.constant(float(scale), FLOAT))
        softcap = getattr(kernel, "softcap", None)
        if softcap is not None:
            cap = g.constant(float(softcap), FLOAT)
            scores = g.op.Mul(g.op.Tanh(g.op.Div(scores, cap)), cap)
        if inputs.bias is not None:
            scores = g.op.Add(scores, g.op.Cast(inputs.bias, to=FLOAT))
        if inputs.mask is not None:
            scores = g.op.Where(inputs.mask, scores, g.constant(float(np.finfo(np.float32).min), FLOAT))
        weights = g.op.Softmax(scores, axis=-1)
        if inputs.mask is not None:
            weights = g.op.Where(inputs.mask, weights, g.constant(0.0, FLOAT))
        batch, heads, q_len = shape_of(q)[:3]
        return g.shaped(weights, [batch, heads, q_len, shape_of(k)[2]], FLOAT)


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
    batch, q_len = shape_of(x)[:2]
    if g.cache_lengths is not None:
        out = _shared_buffer_attention(g, q, k, v, cache, inputs, heads, kv_heads, scale, softcap)
        return g.linear(attention.o_proj, g.shaped(out, [batch, q_len, heads * dim], g.float_type))
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
    return g.linear(attention.o_proj, g.shaped(out, [batch, q_len, heads * dim], g.float_type))


def _shared_buffer_attention(g: GraphBuilder, q: ir.Value, k: ir.Value, v: ir.Value, cache: LayerCache,
                             inputs: AttentionInputs, heads: int, kv_heads: int, scale: float,
                             softcap: float) -> ir.Value:
    """``GroupQueryAttention`` over the layer's buffers (batch, kv_heads, capacity, head_dim),
    which it reads and writes in place when past and present are bound to one value: each
    row's tokens at its first ``seqlens_k + 1`` columns (its new ones last), causal within the
    row, within the mask's window. q (batch, new, heads * head_dim), k and v (batch, new,
    kv_heads * head_dim), rotated already -> (batch, new, heads * head_dim)."""
    window = inputs.restriction.window if inputs.restriction is not None else None
    lengths, buffer = g.cache_lengths, shape_of(cache.key)
    out, cache.key, cache.value = g.op.GroupQueryAttention(
        q, k, v, cache.key, cache.value, lengths.seqlens, lengths.total, _domain="com.microsoft",
        _outputs=3, num_heads=heads, kv_num_heads=kv_heads, scale=float(scale), softcap=float(softcap),
        local_window_size=-1 if window is None else window)  # the keys a query sees, its own among them
    for value in (cache.key, cache.value):
        g.shaped(value, buffer, g.float_type)
    return out
