"""The parts every assembled model shares: token + position embedding, a stack of layers, the
output head, and the self-attention inputs (mask, positions, score bias) built once per stack
call."""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor, nn

from transformer_kit.interfaces import AttentionInputs, AttentionMask, LayerCache, PositionalEncoding
from transformer_kit.masks import positions_from_keep


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

    def forward(self, ids: Tensor, positions: Tensor) -> Tensor:
        """ids, positions (batch, len) -> (batch, len, d_model)."""
        x = self.token(ids)
        if self.scale != 1.0:
            x = x * self.scale
        x = self.positional.embed(x, positions)
        return self.dropout(self.norm(x) if self.norm is not None else x)


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


class Stack(nn.Module):
    """N layers, then a final norm when the layers need one (pre-norm)."""

    def __init__(self, layers: list[nn.Module], final_norm: nn.Module | None) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.final_norm = final_norm

    def forward(self, x: Tensor, self_inputs: AttentionInputs,
                cross_inputs: AttentionInputs | None = None,
                caches: list[LayerCache] | None = None) -> Tensor:
        """x (batch, len, d_model) -> (batch, len, d_model); caches are updated in place."""
        for i, layer in enumerate(self.layers):
            s, c = self_inputs, cross_inputs
            if caches is not None:
                s = replace(self_inputs, cache=caches[i])
                c = None if cross_inputs is None else replace(cross_inputs, cache=caches[i])
            x = layer(x, s, c)
        return self.final_norm(x) if self.final_norm is not None else x


def self_attention_inputs(keep: Tensor, q_len: int, positional: PositionalEncoding,
                          mask: AttentionMask) -> AttentionInputs:
    """Masks, positions and score bias for self-attention of the last ``q_len`` of ``keep``.

    Args:
        keep: (batch, k_len) bool, True for real tokens (cached ones first, then the new ones).
        q_len: how many of the keys are new (the queries).
    """
    k_positions = positions_from_keep(keep)
    # narrow keeps the length q_len itself, which torch.export can reason about (a slice does not)
    q_positions = k_positions.narrow(1, k_positions.shape[1] - q_len, q_len)
    combined = keep[:, None, None, :]
    restriction = mask(q_positions, k_positions)
    if restriction is not None:
        combined = combined & restriction
    bias = positional.score_bias(q_positions, k_positions)
    return AttentionInputs(combined, q_positions, k_positions, bias, positional)
