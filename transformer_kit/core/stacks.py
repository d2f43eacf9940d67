"""The parts every assembled model shares: token + position embedding, a stack of layers, the
output head, and the self-attention inputs (mask, positions, score bias) built once per stack
call."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor, nn

from transformer_kit.core.errors import InputError
from transformer_kit.core.inputs import check_token_ids
from transformer_kit.core.interfaces import AttentionInputs, AttentionMask, LayerCache, PositionalEncoding
from transformer_kit.core.masks import positions_from_real


class Embedder(nn.Module):
    """Token embedding times ``scale`` (the paper's sqrt(d_model), ``scale_embeddings``; or
    ``embedding_scale``) + positions, then a norm when configured (``embedding_norm``, as BERT)."""

    def __init__(self, token: nn.Embedding, positional: PositionalEncoding, dropout: float,
                 scale: float = 1.0, norm: nn.Module | None = None) -> None:
        super().__init__()
        self.token = token
        self.positional = positional
        self.scale = float(scale)
        self.norm = norm
        self.dropout = nn.Dropout(dropout)
        #: An encoder's ``encode`` (texts -> sentence embeddings), set by the encoder; or None.
        self.sentences: Callable[..., Any] | None = None

    def forward(self, ids: Tensor, positions: Tensor | None = None, token_types: Tensor | None = None,
                **options: Any) -> Tensor:
        """ids, positions (batch, len) -> (batch, len, d_model). ``token_types`` (batch, len):
        segment ids, for a positional encoding that has a token-type table (BERT's).

        On an encoder, texts (or lists of token ids) go to the model's sentence embedding:
        ``model.embed(["a text"], prompt_name="query")`` is ``model.encode(...)``."""
        if not isinstance(ids, Tensor) and self.sentences is not None:
            return self.sentences(ids, **options)
        x = self.token(ids)
        if self.scale != 1.0:
            x = x * self.scale
        if token_types is None:
            x = self.positional.embed(x, positions)
        elif (table := self.positional.token_type_table()) is None:
            raise InputError(f"token_type_ids were given, but positional "
                             f"{type(self.positional).__name__} has no token-type table; give "
                             "none (a BERT-style 'learned' encoding with token_types takes them).")
        else:
            types = check_token_ids(token_types, table.num_embeddings,
                                    "token_type_ids")
            x = self.positional.embed(x, positions, token_types=types)
        return self.dropout(self.norm(x) if self.norm is not None else x)


class FeatureEmbedder(nn.Module):
    """An encoder's source that is not tokens: a ``frontend`` (features -> embeddings, Whisper's
    audio stem) + positions; ``features`` (a raw signal -> the frontend's features, Whisper's
    log-mel spectrogram) when the config names one, else None."""

    def __init__(self, frontend: nn.Module, positional: PositionalEncoding, dropout: float,
                 features: nn.Module | None = None) -> None:
        super().__init__()
        self.frontend = frontend
        self.positional = positional
        self.features = features
        self.dropout = nn.Dropout(dropout)

    def forward(self, embeddings: Tensor, positions: Tensor) -> Tensor:
        """The frontend's output (batch, len, d_model) plus the encodings of ``positions``
        (batch, len) -> (batch, len, d_model)."""
        return self.dropout(self.positional.embed(embeddings, positions))


class OutputHead(nn.Linear):
    """The output projection (d_model -> vocab; its parameters ``weight``, ``bias`` as
    ``nn.Linear``'s), then the configured transforms of its logits: times ``scale``
    (``logit_scale``), then ``softcap * tanh(logits / softcap)`` (``logit_softcap``)."""

    def __init__(self, d_model: int, vocab: int, bias: bool = False, scale: float | None = None,
                 softcap: float | None = None) -> None:
        super().__init__(d_model, vocab, bias=bias)
        self.scale, self.softcap = scale, softcap

    def forward(self, x: Tensor) -> Tensor:
        """x (batch, len, d_model) -> logits (batch, len, vocab)."""
        logits = super().forward(x)
        if self.scale is not None and self.scale != 1.0:
            logits = logits * self.scale
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def extra_repr(self) -> str:
        extra = "".join(f", {k}={v}" for k, v in (("scale", self.scale), ("softcap", self.softcap))
                        if v is not None)
        return super().extra_repr() + extra


class LayerVariants(nn.Module):
    """The masks and positional encodings of a stack's layers where they differ by layer (a
    config's ``layer_types``): each variant's own, or None for the stack's.

    Args:
        layer_types: the variant name of each layer.
        masks: per variant name, its mask (None: the stack's).
        positionals: per variant name, its positional encoding (None: the stack's); it acts
            inside attention only (rotation, score bias): the embeddings get the stack's.
    """

    def __init__(self, layer_types: list[str], masks: dict[str, AttentionMask | None],
                 positionals: dict[str, PositionalEncoding | None]) -> None:
        super().__init__()
        self.layer_types = list(layer_types)
        self.masks = masks
        self.positionals = nn.ModuleDict({n: p for n, p in positionals.items() if p is not None})

    def inputs(self, shared: AttentionInputs, real: Tensor, q_len: int,
               positional: PositionalEncoding, mask: AttentionMask) -> list[AttentionInputs]:
        """Each layer's self-attention inputs: ``shared`` (the stack's) where its variant
        replaces neither the mask nor the positional encoding, else its own (built once per
        variant)."""
        by_variant: dict[str, AttentionInputs] = {}
        for name in dict.fromkeys(self.layer_types):
            own_mask = self.masks.get(name)
            own_positional = dict(self.positionals.items()).get(name)
            if own_mask is None and own_positional is None:
                by_variant[name] = shared
            else:
                by_variant[name] = self_attention_inputs(
                    real, q_len, own_positional or positional, own_mask or mask)
        return [by_variant[name] for name in self.layer_types]


class Stack(nn.Module):
    """N layers, then a final norm when the layers need one (pre-norm); ``variants``: the
    masks and positional encodings of layers that differ (``layer_types``), or None."""

    def __init__(self, layers: list[nn.Module], final_norm: nn.Module | None,
                 variants: LayerVariants | None = None) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.final_norm = final_norm
        self.variants = variants

    def attention_inputs(self, real: Tensor, q_len: int, positional: PositionalEncoding,
                         mask: AttentionMask) -> list[AttentionInputs]:
        """Each layer's self-attention inputs for the last ``q_len`` of ``real`` (batch,
        k_len) bool; the first entry's ``q_positions`` are the embeddings' positions."""
        shared = self_attention_inputs(real, q_len, positional, mask)
        if self.variants is None:
            return [shared] * len(self.layers)
        return self.variants.inputs(shared, real, q_len, positional, mask)

    def forward(self, x: Tensor, self_inputs: AttentionInputs | Sequence[AttentionInputs],
                cross_inputs: AttentionInputs | None = None,
                caches: list[LayerCache] | None = None) -> Tensor:
        """x (batch, len, d_model) -> (batch, len, d_model); ``self_inputs``: one for every
        layer, or each layer's (:meth:`attention_inputs`); caches are updated in place."""
        if isinstance(self_inputs, AttentionInputs):
            self_inputs = [self_inputs] * len(self.layers)
        for i, layer in enumerate(self.layers):
            s, c = self_inputs[i], cross_inputs
            if caches is not None:
                s = replace(s, cache=caches[i])
                c = None if cross_inputs is None else replace(cross_inputs, cache=caches[i])
            x = layer(x, s, c)
        return self.final_norm(x) if self.final_norm is not None else x


def self_attention_inputs(real: Tensor, q_len: int, positional: PositionalEncoding,
                          mask: AttentionMask) -> AttentionInputs:
    """Masks, positions and score bias for self-attention of the last ``q_len`` of ``real``.

    Args:
        real: (batch, k_len) bool, True for real tokens (cached ones first, then the new ones).
        q_len: how many of the keys are new (the queries).
    """
    k_positions = positions_from_real(real)
    # narrow keeps the length q_len itself, which torch.export can reason about (a slice does not)
    q_positions = k_positions.narrow(1, k_positions.shape[1] - q_len, q_len)
    combined = real[:, None, None, :]
    restriction = mask(q_positions, k_positions)
    if restriction is not None:
        combined = combined & restriction
    bias = positional.score_bias(q_positions, k_positions)
    return AttentionInputs(combined, q_positions, k_positions, bias, positional)
