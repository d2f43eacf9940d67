"""The graphs an export writes, built from the model's components (no tracing).

Each graph declares its inputs, runs the model's flow on graph values as ``model.py`` runs it on
tensors (the attention inputs of ``stacks.py``, the embedder, the stacks and the heads, each
written by its lowering) and names its outputs:

- ``model``: the full forward with the ``attention_mask`` (1 = real token) as an input; an
  encoder's with its sentence embedding or classifier outputs.
- ``decoder_step``: one decoding step with the key/value cache as plain tensors
  (``past_key_values.{i}.key/value`` in, ``present.{i}.key/value`` out, (batch, kv_heads, len,
  head_dim)); a zero-length past makes one graph serve the prompt and every later token. A
  decoder's gives the logits of the new positions ``logit_positions`` lists (``[-1]``: the last),
  row ``b * n + j`` for row b's position j; an encoder-decoder's the last position's.
- ``decoder_step_shared`` (a decoder whose every self-attention can: :func:`shares_buffers`):
  the same step over one buffer per cache tensor shared by past and present (batch, kv_heads,
  capacity, head_dim), each row's tokens at its first columns: ``seqlens_k`` (batch,) int32
  (each row's length after the step - 1) and ``total_sequence_length`` () int32 (the longest)
  instead of a mask; its positions are the columns.
- ``encoder`` (encoder_decoder): the source mask and every decoder layer's cross-attention keys
  and values (``cross.{i}.key/value``), computed once per input; from ``src_ids``, or from
  ``input_features`` for a model with a frontend (speech).
- ``features`` (a model with a features component): a raw signal to the encoder's
  ``input_features`` (Whisper's log-mel spectrogram), so every runtime gets the same features.
- ``alignment`` (a speech model with alignment heads): the alignment heads' cross-attention
  probabilities of a teacher-forced decoder input, from which word timestamps are read.

The step graph is built first: a component traced for lack of a lowering is then traced at its
most general shapes (new tokens after a past), which the other graphs reuse.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from transformer_kit.core.interfaces import (
    AttentionInputs,
    AttentionMask,
    AttentionWeights,
    LayerCache,
    PositionalEncoding,
)
from transformer_kit.core.model import TransformerModel
from transformer_kit.core.stacks import Stack
from transformer_kit.export.attention_lowering import PACKED_ATTENTION_OPSET, keys_values, shares_buffer
from transformer_kit.export.graph_builder import BOOL, FLOAT, INT32, INT64, CacheLengths, GraphBuilder
from transformer_kit.runtime.step_graph import LOGIT_POSITIONS

#: ``GroupQueryAttention`` takes heads whose width is a multiple of this.
GQA_HEAD_MULTIPLE = 8
#: Far past any sequence: a slice's open end.
_END = 2**62


def kv_names(prefix: str, num_layers: int) -> list[str]:
    """``{prefix}.{i}.key`` and ``.value`` of every layer, in order."""
    return [f"{prefix}.{i}.{part}" for i in range(num_layers) for part in ("key", "value")]


def scores_are_logits(model: TransformerModel) -> bool:
    """Whether a classifier's score activation is the identity (the graph then outputs the
    logits alone: one tensor cannot be two outputs)."""
    return model.config.classifier.score_activation == "identity"


def takes_token_types(model: TransformerModel) -> bool:
    """Whether an encoder's embedding has a token-type table of more than one row (BERT's)."""
    table = model.embed.positional.token_type_table()
    return table is not None and table.num_embeddings > 1


@dataclass
class BuiltGraph:
    """One graph: its ONNX model (weights without values) and its inputs and outputs by name."""

    model: ir.Model
    inputs: list[str]
    outputs: list[str]


def real_of(g: GraphBuilder, mask: ir.Value) -> ir.Value:
    """An attention mask (batch, len) int64 -> (batch, len) bool, True for real tokens."""
    with g.scope(mask.name):
        return g.shaped(g.op.Not(g.op.Equal(mask, [0])), mask.shape, BOOL)


def _all_real(g: GraphBuilder, batch: ir.Value, length: ir.Value) -> ir.Value:
    """(batch, length) bool, all True: a target side without padding."""
    return g.op.ConstantOfShape(g.op.Concat(batch, length, axis=0),
                                value=ir.tensor(np.array([True])))


def attention_inputs(g: GraphBuilder, real: ir.Value, new: ir.Value | None,
                     positional: PositionalEncoding, mask: AttentionMask, mask_path: str
                     ) -> AttentionInputs:
    """Masks, positions and score bias of self-attention over ``real`` (batch, k_len) bool
    (cached tokens, then new ones), for its last ``new`` (1,) int64 positions (None: all), as
    ``stacks.self_attention_inputs`` computes them: positions count real tokens."""
    batch, k_len = list(real.shape)
    counted = g.op.CumSum(g.op.Cast(real, to=INT64), g.constant(np.array(1, np.int64)))
    k_positions = g.shaped(g.op.Max(g.op.Sub(counted, [1]), [0]), [batch, k_len], INT64)
    q_len = k_len if new is None else "new"
    q_positions = k_positions if new is None else g.shaped(  # the last ``new`` of them
        g.op.Slice(k_positions, g.op.Sub(g.op.Shape(real, start=1, end=2), new), [_END], [1]),
        [batch, q_len], INT64)
    combined = g.shaped(g.op.Unsqueeze(real, [1, 2]), [batch, 1, 1, k_len], BOOL)
    restriction = g.call(mask, q_positions, k_positions, path=mask_path)
    if restriction is not None:
        combined = g.shaped(g.op.And(combined, restriction), [batch, 1, q_len, k_len], BOOL)
    bias = g.call(positional, q_positions, k_positions, method="score_bias")
    if bias is not None:
        g.shaped(bias, [batch, g.config.num_heads, q_len, k_len], bias.dtype)
    return AttentionInputs(combined, q_positions, k_positions, bias, positional)


def stack_inputs(g: GraphBuilder, stack: Stack, real: ir.Value, new: ir.Value | None,
                 positional: PositionalEncoding, mask: AttentionMask, mask_path: str
                 ) -> list[AttentionInputs]:
    """Each layer's self-attention inputs, as ``Stack.attention_inputs``: the stack's, or its
    layer variant's own mask and positional encoding (built once per variant)."""
    stack_path = g.path_of(stack, "stack")
    with g.scope(f"{stack_path}.attention_inputs"):
        shared = attention_inputs(g, real, new, positional, mask, mask_path)
    variants = stack.variants
    if variants is None:
        return [shared] * len(stack.layers)
    positionals = dict(variants.positionals.items())
    by_variant = {}
    for name in dict.fromkeys(variants.layer_types):
        own_mask, own_positional = variants.masks.get(name), positionals.get(name)
        if own_mask is None and own_positional is None:
            by_variant[name] = shared
            continue
        with g.scope(f"{stack_path}.variants.{name}.attention_inputs"):
            by_variant[name] = attention_inputs(
                g, real, new, own_positional or positional, own_mask or mask,
                f"{stack_path}.variants.masks.{name}" if own_mask is not None else mask_path)
    return [by_variant[name] for name in variants.layer_types]


def _caches(g: GraphBuilder, model: TransformerModel, prefix: str, length: str) -> list[ir.Value]:
    """Graph inputs ``{prefix}.{i}.key/value`` (batch, kv_heads, length, head_dim)."""
    cfg = model.config
    shape = ["batch", cfg.kv_heads, length, cfg.attention_head_dim]
    return [g.input(name, g.float_type, shape) for name in kv_names(prefix, len(model.decoder.layers))]


def _pairs(values: list[ir.Value]) -> list[tuple[ir.Value, ir.Value]]:
    return [(values[i], values[i + 1]) for i in range(0, len(values), 2)]


# -- decoders --------------------------------------------------------------------------------------
def decoder_model(g: GraphBuilder, model: TransformerModel) -> None:
    ids = g.input("input_ids", INT64, ["batch", "len"])
    real = real_of(g, g.input("attention_mask", INT64, ["batch", "len"]))
    inputs = stack_inputs(g, model.decoder, real, None, model.embed.positional, model.mask, "mask")
    x = g.call(model.embed, ids, inputs[0].q_positions)
    x = g.call(model.decoder, x, inputs)
    g.output(g.call(model.head, x), "logits")


def decoder_step(g: GraphBuilder, model: TransformerModel) -> None:
    ids = g.input("input_ids", INT64, ["batch", "new"])
    real = real_of(g, g.input("attention_mask", INT64, ["batch", "total"]))
    past = _caches(g, model, "past_key_values", "past")
    positions = g.input(LOGIT_POSITIONS, INT64, ["kept"])
    with g.scope("input_ids"):
        new = g.op.Shape(ids, start=1, end=2)
    inputs = stack_inputs(g, model.decoder, real, new, model.embed.positional, model.mask, "mask")
    caches = [LayerCache(k, v) for k, v in _pairs(past)]
    x = g.call(model.embed, ids, inputs[0].q_positions)
    x = g.call(model.decoder, x, inputs, None, caches)
    with g.scope(LOGIT_POSITIONS):
        x = g.shaped(g.op.Gather(x, positions, axis=1), ["batch", "kept", model.config.d_model],
                     g.float_type)
    logits = g.call(model.head, x)
    with g.scope("head"):
        logits = g.op.Reshape(logits, [-1, model.config.tgt_vocab])
    g.output(logits, "logits")
    for i, cache in enumerate(caches):
        g.output(cache.key, f"present.{i}.key")
        g.output(cache.value, f"present.{i}.value")


def _variant_parts(stack: Stack, positional: PositionalEncoding, mask: AttentionMask
                   ) -> list[tuple[PositionalEncoding, AttentionMask]]:
    """Each layer's positional encoding and mask (its variant's own where it has one)."""
    variants = stack.variants
    if variants is None:
        return [(positional, mask)] * len(stack.layers)
    positionals = dict(variants.positionals.items())
    return [(positionals.get(name) or positional, variants.masks.get(name) or mask)
            for name in variants.layer_types]


def shares_buffers(model: TransformerModel, opset: int) -> bool:
    """Whether a decoder gets a step graph over cache buffers shared by past and present
    (``decoder_step_shared``): every layer's self-attention can (``shares_buffer``), its heads
    a multiple of 8 wide (as onnxruntime's ``GroupQueryAttention`` takes them)."""
    if (model.architecture != "decoder" or opset < PACKED_ATTENTION_OPSET
            or model.config.attention_head_dim % GQA_HEAD_MULTIPLE):
        return False
    parts = _variant_parts(model.decoder, model.embed.positional, model.mask)
    return all(shares_buffer(layer.self_attention, positional, mask)
               for layer, (positional, mask) in zip(model.decoder.layers, parts, strict=True))


def decoder_step_shared(g: GraphBuilder, model: TransformerModel) -> None:
    ids = g.input("input_ids", INT64, ["batch", "new"])
    seqlens = g.input("seqlens_k", INT32, ["batch"])
    total = g.input("total_sequence_length", INT32, [])
    buffers = _caches(g, model, "past_key_values", "capacity")
    positions = g.input(LOGIT_POSITIONS, INT64, ["kept"])
    g.cache_lengths = CacheLengths(seqlens, total)
    with g.scope("positions"):  # a row's new tokens are its last: columns seqlens_k + 1 - new ..
        new = g.op.Squeeze(g.op.Shape(ids, start=1, end=2), [0])
        first = g.op.Sub(g.op.Add(g.op.Cast(seqlens, to=INT64), [1]), g.op.Unsqueeze(new, [0]))
        offsets = g.op.Range(g.constant(np.array(0, np.int64)), new, g.constant(np.array(1, np.int64)))
        q_positions = g.shaped(g.op.Add(g.op.Unsqueeze(first, [1]), g.op.Unsqueeze(offsets, [0])),
                               ["batch", "new"], INT64)
    parts = _variant_parts(model.decoder, model.embed.positional, model.mask)
    inputs = [AttentionInputs(None, q_positions, positional=positional, restriction=mask)
              for positional, mask in parts]
    caches = [LayerCache(k, v) for k, v in _pairs(buffers)]
    x = g.call(model.embed, ids, q_positions)
    x = g.call(model.decoder, x, inputs, None, caches)
    with g.scope(LOGIT_POSITIONS):
        x = g.shaped(g.op.Gather(x, positions, axis=1), ["batch", "kept", model.config.d_model],
                     g.float_type)
    logits = g.call(model.head, x)
    with g.scope("head"):
        logits = g.op.Reshape(logits, [-1, model.config.tgt_vocab])
    g.output(logits, "logits")
    for i, cache in enumerate(caches):
        g.output(cache.key, f"present.{i}.key")
        g.output(cache.value, f"present.{i}.value")


# -- encoders --------------------------------------------------------------------------------------
def encoder_model(g: GraphBuilder, model: TransformerModel) -> None:
    ids = g.input("input_ids", INT64, ["batch", "len"])
    real = real_of(g, g.input("attention_mask", INT64, ["batch", "len"]))
    sentence = model.config.sentence_embedding
    pooling_mask = types = None
    if model.sentence_head is not None and sentence is not None and not sentence.include_prompt:
        pooling_mask = g.input("pooling_mask", INT64, ["batch", "len"])
    if model.classifier is not None and takes_token_types(model):
        types = g.input("token_type_ids", INT64, ["batch", "len"])
    inputs = stack_inputs(g, model.encoder, real, None, model.embed.positional, model.mask, "mask")
    x = g.call(model.embed, ids, inputs[0].q_positions, types)
    hidden = g.call(model.encoder, x, inputs)
    if model.sentence_head is not None:
        pooled = real
        if pooling_mask is not None:
            pooling_real = real_of(g, pooling_mask)
            with g.scope("pooling_mask"):
                pooled = g.shaped(g.op.And(real, pooling_real), real.shape, BOOL)
        embedding = g.call(model.sentence_head, hidden, pooled)
        g.output(hidden, "last_hidden_state")
        g.output(embedding, "sentence_embedding")
    elif model.classifier is not None:
        logits, scores = g.call(model.classifier, hidden)
        g.output(logits, "logits")
        if not scores_are_logits(model):
            g.output(scores, "scores")
    elif model.head is not None:
        g.output(g.call(model.head, hidden), "logits")
    else:
        g.output(hidden, "last_hidden_state")


# -- encoder-decoders ------------------------------------------------------------------------------
def _encode(g: GraphBuilder, model: TransformerModel, src: ir.Value, real: ir.Value) -> ir.Value:
    """memory (batch, src_len, d_model) of the source, as ``EncoderDecoderTransformer.encode``."""
    inputs = stack_inputs(g, model.encoder, real, None, model.src_embed.positional, model.encoder_mask,
                          "encoder_mask")
    return g.call(model.encoder, g.call(model.src_embed, src, inputs[0].q_positions), inputs)


def _decode(g: GraphBuilder, model: TransformerModel, tgt: ir.Value, memory: ir.Value | None,
            src_real: ir.Value, caches: list[LayerCache] | None, real: ir.Value | None = None,
            weights: AttentionWeights | None = None) -> ir.Value:
    """The decoder stack's output (batch, new, d_model) for target tokens after the cached ones,
    as ``EncoderDecoderTransformer.decode`` (without the head); ``real`` (batch, total) bool
    says which of the cached and new target tokens are real (None: all of them); ``weights``:
    cross-attention probabilities to record."""
    with g.scope(g.path_of(model.decoder, "decoder") + ".attention_inputs"):
        new = g.op.Shape(tgt, start=1, end=2)
        if real is None:
            length, total = (new, "len") if caches is None else (
                g.op.Add(g.op.Shape(caches[0].key, start=2, end=3), new), "total")
            real = g.shaped(_all_real(g, g.op.Shape(tgt, start=0, end=1), length), ["batch", total], BOOL)
        src_mask = g.shaped(g.op.Unsqueeze(src_real, [1, 2]), ["batch", 1, 1, "src_len"], BOOL)
    self_inputs = stack_inputs(g, model.decoder, real, None if caches is None else new,
                               model.tgt_embed.positional, model.decoder_mask, "decoder_mask")
    cross = AttentionInputs(mask=src_mask, memory=memory, weights=weights)
    x = g.call(model.tgt_embed, tgt, self_inputs[0].q_positions)
    return g.call(model.decoder, x, self_inputs, cross, caches)


def _encode_features(g: GraphBuilder, model: TransformerModel, features: ir.Value
                     ) -> tuple[ir.Value, ir.Value]:
    """memory (batch, src_len, d_model) of features (batch, channels, frames), every one of the
    frontend's outputs real, as ``EncoderDecoderTransformer.encode`` of a model with a frontend."""
    embed = model.src_embed
    if g.float_type != FLOAT:
        with g.scope("input_features"):
            features = g.op.Cast(features, to=g.float_type)
    x = g.call(embed.frontend, features)
    with g.scope(g.path_of(model.encoder, "encoder") + ".attention_inputs"):
        real = g.shaped(_all_real(g, g.op.Shape(x, start=0, end=1), g.op.Shape(x, start=1, end=2)),
                        ["batch", "src_len"], BOOL)
    inputs = stack_inputs(g, model.encoder, real, None, embed.positional, model.encoder_mask,
                          "encoder_mask")
    return g.call(model.encoder, g.call(embed, x, inputs[0].q_positions), inputs), real


def _source(g: GraphBuilder, model: TransformerModel) -> tuple[ir.Value, ir.Value]:
    """The source's graph inputs encoded: memory (batch, src_len, d_model) and src_real (batch,
    src_len) bool; ``input_features`` for a model with a frontend, else ``src_ids`` and their
    ``attention_mask``."""
    if model.takes_features:
        channels = model.src_embed.frontend.in_channels
        return _encode_features(g, model, g.input("input_features", FLOAT, ["batch", channels, "frames"]))
    src = g.input("src_ids", INT64, ["batch", "src_len"])
    real = real_of(g, g.input("attention_mask", INT64, ["batch", "src_len"]))
    return _encode(g, model, src, real), real


def seq2seq_model(g: GraphBuilder, model: TransformerModel) -> None:
    memory, real = _source(g, model)
    tgt = g.input("tgt_ids", INT64, ["batch", "len"])
    g.output(g.call(model.head, _decode(g, model, tgt, memory, real, None)), "logits")


def seq2seq_features(g: GraphBuilder, model: TransformerModel) -> None:
    """``features`` (a model with a features component): 16 kHz samples (batch, n_samples)
    float32 -> ``input_features`` (batch, channels, frames) float32, the encoder's input."""
    samples = g.input("samples", FLOAT, ["batch", "n_samples"])
    g.output(g.call(model.src_embed.features, samples), "input_features")


def seq2seq_encoder(g: GraphBuilder, model: TransformerModel) -> None:
    memory, real = _source(g, model)
    with g.scope("encoder_attention_mask"):
        g.output(g.op.Cast(real, to=INT64), "encoder_attention_mask")
    for i, layer in enumerate(model.decoder.layers):
        key, value = keys_values(g, layer.cross_attention, memory)
        g.output(key, f"cross.{i}.key")
        g.output(value, f"cross.{i}.value")


def seq2seq_alignment(g: GraphBuilder, model: TransformerModel) -> None:
    """``alignment`` (a speech model with alignment heads): ``input_features`` and the decoder's
    input ``input_ids`` (batch, len), teacher-forced -> ``alignment_weights`` (batch, heads,
    len, src_len) float32, the cross-attention probabilities of the config's alignment heads in
    their order (``EncoderDecoderTransformer.cross_attention_weights``): word timestamps."""
    memory, real = _source(g, model)
    tgt = g.input("input_ids", INT64, ["batch", "len"])
    heads = model.config.speech.alignment_heads
    layers = model.decoder.layers
    weights = AttentionWeights([layers[layer].cross_attention for layer, _ in heads])
    _decode(g, model, tgt, memory, real, None, weights=weights)
    with g.scope("alignment_weights"):
        picked = [g.op.Slice(weights.of_module(layers[layer].cross_attention), [head], [head + 1], [1])
                  for layer, head in heads]
        stacked = g.shaped(g.op.Concat(*picked, axis=1), ["batch", len(heads), "len", "src_len"], FLOAT)
    g.output(stacked, "alignment_weights")


def seq2seq_step(g: GraphBuilder, model: TransformerModel) -> None:
    ids = g.input("input_ids", INT64, ["batch", "new"])
    # which target tokens are real: rows of other lengths decode together left-padded (a
    # server's batch), their positions counted from it as a decoder's
    real = real_of(g, g.input("attention_mask", INT64, ["batch", "total"]))
    src_real = real_of(g, g.input("encoder_attention_mask", INT64, ["batch", "src_len"]))
    cross = _caches(g, model, "cross", "src_len")
    past = _caches(g, model, "past_key_values", "past")
    caches = [LayerCache(k, v, ck, cv) for (k, v), (ck, cv) in zip(_pairs(past), _pairs(cross), strict=True)]
    x = _decode(g, model, ids, None, src_real, caches, real)
    with g.scope("head"):  # the last position's logits alone
        last = g.shaped(g.op.Gather(x, g.constant(-1), axis=1), ["batch", model.config.d_model],
                        g.float_type)
    g.output(g.call(model.head, last), "logits")
    for i, cache in enumerate(caches):
        g.output(cache.key, f"present.{i}.key")
        g.output(cache.value, f"present.{i}.value")


#: Per architecture, its graphs in the order they are built (the step first).
GRAPHS: dict[str, dict[str, Callable[[GraphBuilder, TransformerModel], None]]] = {
    "decoder": {"decoder_step": decoder_step, "decoder_step_shared": decoder_step_shared,
                "model": decoder_model},
    "encoder": {"model": encoder_model},
    "encoder_decoder": {"decoder_step": seq2seq_step, "encoder": seq2seq_encoder, "model": seq2seq_model,
                        "features": seq2seq_features, "alignment": seq2seq_alignment},
}


def build_graph(name: str, model: TransformerModel, make_builder: Callable[[str], GraphBuilder]
                ) -> BuiltGraph:
    """Graph ``name`` of ``model``, written by a builder from ``make_builder(name)``."""
    g = make_builder(name)
    GRAPHS[model.architecture][name](g, model)
    return BuiltGraph(g.model_ir(), [v.name for v in g.graph.inputs], [v.name for v in g.graph.outputs])


def graph_names(model: TransformerModel, opset: int) -> list[str]:
    """The graphs ``model`` exports at ``opset``, in the order they are built."""
    names = list(GRAPHS[model.architecture])
    if "decoder_step_shared" in names and not shares_buffers(model, opset):
        names.remove("decoder_step_shared")
    if "features" in names and not (model.takes_features and model.src_embed.features is not None):
        names.remove("features")
    speech = model.config.speech if model.architecture == "encoder_decoder" else None
    if "alignment" in names and not (model.takes_features and speech is not None and speech.alignment_heads):
        names.remove("alignment")
    return names
