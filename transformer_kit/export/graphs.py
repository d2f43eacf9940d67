"""The graphs an export writes, as small ``nn.Module`` wrappers with named inputs and outputs.

- ``model``: the full forward, as ``model.forward``, with the ``attention_mask`` (1 = real token)
  as an input (``OnnxModel`` makes it from ``pad_id`` when the caller gives none).
- ``decoder_step``: one decoding step with the key/value cache as plain tensors
  (``past_key_values.{i}.key/value`` in, ``present.{i}.key/value`` out); a zero-length past
  makes the same graph serve the prompt and every later token. Returns the last position's
  logits (``logit_positions`` = ``[-1]``), or those of the new positions it lists.
- an encoder's ``model`` with a sentence embedding also outputs ``sentence_embedding``
  (batch, dim) beside ``last_hidden_state``; a cross-encoder's outputs its classifier's
  ``logits`` and ``scores`` (batch, num_labels; the logits alone when the scores are them)
  instead of the hidden states.
- ``encoder`` (encoder_decoder only): the source mask and every decoder layer's cross-attention
  keys and values (``cross.{i}.key/value``), computed once per input.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.export import Dim

from transformer_kit.attention import LayerCache
from transformer_kit.export.onnx_steps import LOGIT_POSITIONS
from transformer_kit.model import TransformerModel

#: Example sizes for tracing: all at least 2 and all different, so none freezes into the graph.
EXAMPLE_BATCH, EXAMPLE_LEN, EXAMPLE_TGT_LEN, EXAMPLE_PAST = 2, 5, 3, 4


def kv_names(prefix: str, num_layers: int) -> list[str]:
    return [f"{prefix}.{i}.{part}" for i in range(num_layers) for part in ("key", "value")]


def _pairs(flat: list[Tensor]) -> list[tuple[Tensor, Tensor]]:
    return [(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)]


class DecoderStep(nn.Module):
    """input_ids (batch, new), attention_mask (batch, past + new) int64 (1 = real token),
    past_key_values 2 x layers of (batch, kv_heads, past, head_dim),
    logit_positions (n,) int64 indices into the new positions (``[-1]``: the last; negative
    ones count from the end)
    -> logits (batch x n, vocab): row ``b * n + j`` is row b's at position ``logit_positions[j]``,
       present 2 x layers of (batch, kv_heads, past + new, head_dim)."""

    def __init__(self, model: TransformerModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, attention_mask: Tensor, past_key_values: list[Tensor],
                logit_positions: Tensor):
        caches = [LayerCache(k, v) for k, v in _pairs(past_key_values)]
        logits = self.model.step(input_ids, attention_mask != 0, caches, positions=logit_positions)
        return (logits.reshape(-1, logits.shape[-1]), *[t for c in caches for t in (c.key, c.value)])


class EncoderForDecoding(nn.Module):
    """src_ids, attention_mask (batch, src_len) -> encoder_attention_mask (batch, src_len) int64 and
    cross.{i}.key/value (batch, kv_heads, src_len, head_dim) for each decoder layer."""

    def __init__(self, model: TransformerModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, src_ids: Tensor, attention_mask: Tensor):
        memory, keep = self.model.encode(src_ids, attention_mask)
        cross = []
        for layer in self.model.decoder.layers:
            cross.extend(layer.cross_attention.keys_values(memory))
        return (keep.long(), *cross)


class Seq2SeqDecoderStep(nn.Module):
    """input_ids (batch, new), encoder_attention_mask (batch, src_len), cross keys/values,
    past_key_values -> logits (batch, vocab) of the last position and present keys/values."""

    def __init__(self, model: TransformerModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, encoder_attention_mask: Tensor,
                cross_key_values: list[Tensor], past_key_values: list[Tensor]):
        caches = [LayerCache(k, v, ck, cv) for (k, v), (ck, cv)
                  in zip(_pairs(past_key_values), _pairs(cross_key_values), strict=True)]
        logits = self.model.decode(input_ids, None, encoder_attention_mask != 0, caches,
                                   last_only=True)[:, -1]
        return (logits, *[t for c in caches for t in (c.key, c.value)])


class SentenceGraph(nn.Module):
    """input_ids, attention_mask (batch, len) [, pooling_mask (batch, len), 1 = pooled]
    -> last_hidden_state (batch, len, d_model), sentence_embedding (batch, dim)."""

    def __init__(self, model: TransformerModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, attention_mask: Tensor, pooling_mask: Tensor | None = None):
        hidden, keep = self.model.hidden_states(input_ids, attention_mask)
        pooled = keep if pooling_mask is None else keep & (pooling_mask != 0)
        return hidden, self.model.sentence_head(hidden, pooled)


class ClassifierGraph(nn.Module):
    """input_ids, attention_mask [, token_type_ids] (batch, len) -> logits, scores
    (batch, num_labels)."""

    def __init__(self, model: TransformerModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, attention_mask: Tensor,
                token_type_ids: Tensor | None = None):
        logits, scores = self.model.classify(input_ids, attention_mask, token_type_ids)
        return logits if scores_are_logits(self.model) else (logits, scores)


def scores_are_logits(model: TransformerModel) -> bool:
    """Whether a classifier's score activation is the identity (the graph then outputs the
    logits alone: one tensor cannot be two outputs)."""
    return model.config.classifier.score_activation == "identity"


def takes_token_types(model: TransformerModel) -> bool:
    """Whether an encoder's embedding has a token-type table of more than one row (BERT's)."""
    table = getattr(model.embed.positional, "token_type", None)
    return table is not None and table.num_embeddings > 1


def _encoder_spec(model: TransformerModel, ids: Tensor, token_shapes: dict) -> GraphSpec:
    """The ``model`` graph of an encoder: hidden states (or logits), with its sentence head's
    or classifier's outputs."""
    mask = _mask(ids, model.config.pad_id)
    names = ["input_ids", "attention_mask"]
    if model.sentence_head is not None:
        sentence = model.config.sentence_embedding
        if sentence is not None and not sentence.include_prompt:
            pooled = mask.clone()
            pooled[:, :1] = 0  # a one-token prompt left out
            return GraphSpec(SentenceGraph(model), (ids, mask, pooled),
                             {**token_shapes, "pooling_mask": token_shapes["input_ids"]},
                             [*names, "pooling_mask"], ["last_hidden_state", "sentence_embedding"])
        return GraphSpec(SentenceGraph(model), (ids, mask), token_shapes, names,
                         ["last_hidden_state", "sentence_embedding"])
    if model.classifier is not None:
        outputs = ["logits"] if scores_are_logits(model) else ["logits", "scores"]
        if takes_token_types(model):
            types = torch.zeros_like(ids)
            types[:, ids.shape[1] // 2:] = 1  # a pair's second text
            return GraphSpec(ClassifierGraph(model), (ids, mask, types),
                             {**token_shapes, "token_type_ids": token_shapes["input_ids"]},
                             [*names, "token_type_ids"], outputs)
        return GraphSpec(ClassifierGraph(model), (ids, mask), token_shapes, names, outputs)
    output = "logits" if model.head is not None else "last_hidden_state"
    return GraphSpec(model, (ids, mask), token_shapes, names, [output])


@dataclass
class GraphSpec:
    """What ``torch.onnx.export`` needs for one graph."""

    module: nn.Module
    args: tuple[Any, ...]
    dynamic_shapes: dict[str, Any]
    inputs: list[str]
    outputs: list[str]


def _mask(ids: Tensor, pad_id: int | None) -> Tensor:
    """(batch, len) int64 attention mask of example ids: 1 for real tokens."""
    return (ids != pad_id).long() if pad_id is not None else torch.ones_like(ids)


def _ids(batch: int, length: int, vocab: int, pad_id: int | None) -> Tensor:
    gen = torch.Generator().manual_seed(batch * 100 + length)
    ids = torch.randint(0, vocab, (batch, length), generator=gen)
    if pad_id is not None:
        ids[ids == pad_id] = (pad_id + 1) % vocab
        ids[-1, -1] = pad_id  # trace with padding present
    return ids


def graph_specs(model: TransformerModel) -> dict[str, GraphSpec]:
    """The graphs to export for ``model`` with example inputs and dynamic axes."""
    cfg = model.config
    batch, length, new, past = Dim("batch"), Dim("length"), Dim("new"), Dim("past")
    src_len, total = Dim("src_len"), Dim("total")
    b, n, t, p = EXAMPLE_BATCH, EXAMPLE_LEN, EXAMPLE_TGT_LEN, EXAMPLE_PAST
    param = next(model.parameters())
    token_shapes = {"input_ids": {0: batch, 1: length}, "attention_mask": {0: batch, 1: length}}
    specs: dict[str, GraphSpec] = {}
    if model.architecture == "encoder":
        specs["model"] = _encoder_spec(model, _ids(b, n, cfg.vocab_size, cfg.pad_id), token_shapes)
        return specs
    layers = len(model.decoder.layers)
    heads, head_dim = cfg.kv_heads, cfg.attention_head_dim
    past_kv = [param.new_zeros(b, heads, p, head_dim).normal_() for _ in range(2 * layers)]
    past_shapes = [{0: batch, 2: past}] * (2 * layers)
    if model.architecture == "decoder":
        ids = _ids(b, n, cfg.vocab_size, cfg.pad_id)
        specs["model"] = GraphSpec(model, (ids, _mask(ids, cfg.pad_id)), token_shapes,
                                   ["input_ids", "attention_mask"], ["logits"])
        mask = torch.ones(b, p + t, dtype=torch.long)
        mask[-1, 0] = 0  # a left-padded row
        positions = torch.tensor([0, 2, 1, 2, 0, 1])  # a length no other axis has
        specs["decoder_step"] = GraphSpec(
            DecoderStep(model), (_ids(b, t, cfg.vocab_size, None), mask, past_kv, positions),
            {"input_ids": {0: batch, 1: new}, "attention_mask": {0: batch, 1: total},
             "past_key_values": past_shapes, "logit_positions": {0: Dim("kept")}},
            ["input_ids", "attention_mask", *kv_names("past_key_values", layers), LOGIT_POSITIONS],
            ["logits", *kv_names("present", layers)],
        )
        return specs
    src = _ids(b, n, cfg.src_vocab, cfg.pad_id)
    src_mask = _mask(src, cfg.pad_id)
    specs["model"] = GraphSpec(
        model, (src, _ids(b, t, cfg.tgt_vocab, None), src_mask),
        {"src_ids": {0: batch, 1: src_len}, "tgt_ids": {0: batch, 1: length},
         "attention_mask": {0: batch, 1: src_len}},
        ["src_ids", "tgt_ids", "attention_mask"], ["logits"])
    specs["encoder"] = GraphSpec(
        EncoderForDecoding(model), (src, src_mask),
        {"src_ids": {0: batch, 1: src_len}, "attention_mask": {0: batch, 1: src_len}},
        ["src_ids", "attention_mask"], ["encoder_attention_mask", *kv_names("cross", layers)])
    cross = [param.new_zeros(b, heads, n, head_dim).normal_() for _ in range(2 * layers)]
    specs["decoder_step"] = GraphSpec(
        Seq2SeqDecoderStep(model), (_ids(b, t, cfg.tgt_vocab, None), src_mask, cross, past_kv),
        {"input_ids": {0: batch, 1: new}, "encoder_attention_mask": {0: batch, 1: src_len},
         "cross_key_values": [{0: batch, 2: src_len}] * (2 * layers), "past_key_values": past_shapes},
        ["input_ids", "encoder_attention_mask", *kv_names("cross", layers),
         *kv_names("past_key_values", layers)],
        ["logits", *kv_names("present", layers)],
    )
    return specs
