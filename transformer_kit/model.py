"""The assembled models: encoder-decoder (the paper), encoder-only and decoder-only.

Every model is a plain ``torch.nn.Module`` built from registry components by
:func:`transformer_kit.build_model`. Decoding runs through one step function taking explicit
key/value caches (:class:`LayerCache`, plain tensors), so the uncached forward, cached
generation and the exported decoder step share one code path.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import torch
from torch import Tensor, nn

from transformer_kit.config import ModelConfig
from transformer_kit.errors import InputError
from transformer_kit.generation import generate
from transformer_kit.inputs import check_token_ids, tracing
from transformer_kit.interfaces import AttentionInputs, AttentionMask, LayerCache, PositionalEncoding
from transformer_kit.masks import keep_mask, positions_from_keep
from transformer_kit.registry_entries import RegisteredComponent
from transformer_kit.serialization import save_model


class Embedder(nn.Module):
    """Token embedding (scaled by sqrt(d_model) as in the paper, if configured) + positions,
    then a norm when configured (``embedding_norm``, as BERT)."""

    def __init__(self, token: nn.Embedding, positional: PositionalEncoding, dropout: float,
                 scale: bool, norm: nn.Module | None = None) -> None:
        super().__init__()
        self.token = token
        self.positional = positional
        self.scale = math.sqrt(token.embedding_dim) if scale else 1.0
        self.norm = norm
        self.dropout = nn.Dropout(dropout)

    def forward(self, ids: Tensor, positions: Tensor) -> Tensor:
        """ids, positions (batch, len) -> (batch, len, d_model)."""
        x = self.token(ids)
        if self.scale != 1.0:
            x = x * self.scale
        x = self.positional.embed(x, positions)
        return self.dropout(self.norm(x) if self.norm is not None else x)


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


class TransformerModel(nn.Module):
    """Base of the assembled models: config, save, cache construction, generation."""

    architecture: str

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        #: The registered component of each kind, with its plugin (set by build_model).
        self.components: dict[str, RegisteredComponent] = {}

    def _lacking(self, flag: str) -> list[str]:
        """Chosen components whose ``flag`` (supports_cache, exportable) is False, named."""
        return [f"{kind} {e.component.name!r} (plugin {e.plugin!r})"
                for kind, e in self.components.items() if not getattr(e.component, flag)]

    @property
    def uncacheable(self) -> list[str]:
        """Components that declared ``supports_cache=False``, named with their plugin."""
        return self._lacking("supports_cache")

    @property
    def unexportable(self) -> list[str]:
        """Components that declared ``exportable=False``, named with their plugin."""
        return self._lacking("exportable")

    @property
    def max_positions(self) -> int | None:
        """Longest sequence the positional encoding covers, or None when unbounded."""
        return None

    def save(self, path: str | Path) -> Path:
        """Write ``config.json`` and ``model.safetensors`` into the folder ``path``."""
        return save_model(self, path)

    def generate(self, ids: Tensor, max_new_tokens: int = 32, *, use_cache: bool = True) -> Tensor:
        """Greedy decoding: (batch, len) prompts (decoder) or source ids (encoder_decoder, from
        ``bos_id``) -> (batch, steps) new tokens; see :func:`transformer_kit.generation.generate`."""
        return generate(self, ids, max_new_tokens, use_cache=use_cache)

    def _empty_cache(self, stack: Stack, batch: int, like: Tensor) -> list[LayerCache]:
        caches = []
        for layer in stack.layers:
            attn = layer.self_attention
            empty = like.new_zeros(batch, attn.num_kv_heads, 0, attn.head_dim)
            caches.append(LayerCache(empty, empty))
        return caches


class EncoderDecoderTransformer(TransformerModel):
    """The paper's model: ``model(src_ids, tgt_ids) -> logits`` (batch, tgt_len, tgt_vocab)."""

    architecture = "encoder_decoder"

    def __init__(self, config: ModelConfig, src_embed: Embedder, tgt_embed: Embedder,
                 encoder: Stack, decoder: Stack, head: nn.Linear, encoder_mask: AttentionMask,
                 decoder_mask: AttentionMask) -> None:
        super().__init__(config)
        self.src_embed, self.tgt_embed = src_embed, tgt_embed
        self.encoder, self.decoder = encoder, decoder
        self.head = head
        self.encoder_mask, self.decoder_mask = encoder_mask, decoder_mask

    @property
    def max_positions(self) -> int | None:
        return self.tgt_embed.positional.max_positions

    def encode(self, src_ids: Tensor) -> tuple[Tensor, Tensor]:
        """src_ids (batch, src_len) -> memory (batch, src_len, d_model), src_keep (batch, src_len)."""
        src_ids = check_token_ids(src_ids, self.config.src_vocab, "src_ids")
        keep = keep_mask(src_ids, self.config.pad_id)
        inputs = self_attention_inputs(keep, src_ids.shape[1], self.src_embed.positional,
                                       self.encoder_mask)
        memory = self.encoder(self.src_embed(src_ids, inputs.q_positions), inputs)
        return memory, keep

    def decode(self, tgt_ids: Tensor, memory: Tensor | None, src_keep: Tensor,
               caches: list[LayerCache] | None = None, *, last_only: bool = False) -> Tensor:
        """Logits (batch, new_len, tgt_vocab) for target tokens after the cached ones.

        Args:
            tgt_ids: (batch, new_len) the target tokens not yet in ``caches``.
            memory: (batch, src_len, d_model) from :meth:`encode`; may be None when every
                cache already holds its cross-attention keys and values.
            src_keep: (batch, src_len) bool, True for real source tokens.
            caches: per-layer caches, extended in place; None for an uncached call.
            last_only: return the logits of the last position only, (batch, 1, tgt_vocab).
        """
        tgt_ids = check_token_ids(tgt_ids, self.config.tgt_vocab, "tgt_ids")
        past = caches[0].key.shape[2] if caches else 0
        batch, new_len = tgt_ids.shape
        keep = torch.ones(batch, past + new_len, dtype=torch.bool, device=tgt_ids.device)
        self_inputs = self_attention_inputs(keep, new_len, self.tgt_embed.positional,
                                            self.decoder_mask)
        cross_inputs = AttentionInputs(mask=src_keep[:, None, None, :], memory=memory)
        x = self.decoder(self.tgt_embed(tgt_ids, self_inputs.q_positions), self_inputs,
                         cross_inputs, caches)
        return self.head(x[:, -1:] if last_only else x)

    def forward(self, src_ids: Tensor, tgt_ids: Tensor) -> Tensor:
        """src_ids (batch, src_len), tgt_ids (batch, tgt_len) -> logits (batch, tgt_len, V)."""
        if (isinstance(src_ids, Tensor) and isinstance(tgt_ids, Tensor) and not tracing()
                and src_ids.dim() >= 1 and tgt_ids.dim() >= 1 and len(src_ids) != len(tgt_ids)):
            raise InputError(f"src_ids has {len(src_ids)} rows but tgt_ids has {len(tgt_ids)}; "
                             "give one target row per source row.")
        memory, src_keep = self.encode(src_ids)
        return self.decode(tgt_ids, memory, src_keep)

    def new_cache(self, batch: int, like: Tensor) -> list[LayerCache]:
        """Empty per-layer caches (zero-length past) for ``batch`` rows, dtype/device of ``like``."""
        return self._empty_cache(self.decoder, batch, like)


class DecoderTransformer(TransformerModel):
    """Decoder-only language model: ``model(input_ids) -> logits`` (batch, len, vocab)."""

    architecture = "decoder"

    def __init__(self, config: ModelConfig, embed: Embedder, decoder: Stack, head: nn.Linear,
                 mask: AttentionMask) -> None:
        super().__init__(config)
        self.embed, self.decoder, self.head, self.mask = embed, decoder, head, mask

    @property
    def max_positions(self) -> int | None:
        return self.embed.positional.max_positions

    def step(self, input_ids: Tensor, keep: Tensor, caches: list[LayerCache] | None = None,
             *, last_only: bool = False) -> Tensor:
        """Logits (batch, new_len, vocab) for tokens after the cached ones.

        Args:
            input_ids: (batch, new_len) tokens not yet in ``caches``.
            keep: (batch, past_len + new_len) bool, True for real tokens (False for padding).
            caches: per-layer caches, extended in place; None for an uncached call.
            last_only: return the logits of the last position only, (batch, 1, vocab).
        """
        input_ids = check_token_ids(input_ids, self.config.vocab_size, "input_ids")
        inputs = self_attention_inputs(keep, input_ids.shape[1], self.embed.positional, self.mask)
        x = self.decoder(self.embed(input_ids, inputs.q_positions), inputs, None, caches)
        return self.head(x[:, -1:] if last_only else x)

    def forward(self, input_ids: Tensor) -> Tensor:
        """input_ids (batch, len), ``pad_id`` marking padding -> logits (batch, len, vocab)."""
        input_ids = check_token_ids(input_ids, self.config.vocab_size, "input_ids")
        return self.step(input_ids, keep_mask(input_ids, self.config.pad_id))

    def new_cache(self, batch: int, like: Tensor) -> list[LayerCache]:
        """Empty per-layer caches (zero-length past) for ``batch`` rows, dtype/device of ``like``."""
        return self._empty_cache(self.decoder, batch, like)


class EncoderTransformer(TransformerModel):
    """Encoder-only model: ``model(input_ids) -> hidden states`` (batch, len, d_model), or
    logits (batch, len, vocab) when ``lm_head`` is configured."""

    architecture = "encoder"

    def __init__(self, config: ModelConfig, embed: Embedder, encoder: Stack,
                 head: nn.Linear | None, mask: AttentionMask) -> None:
        super().__init__(config)
        self.embed, self.encoder, self.head, self.mask = embed, encoder, head, mask

    @property
    def max_positions(self) -> int | None:
        return self.embed.positional.max_positions

    def forward(self, input_ids: Tensor) -> Tensor:
        input_ids = check_token_ids(input_ids, self.config.vocab_size, "input_ids")
        keep = keep_mask(input_ids, self.config.pad_id)
        inputs = self_attention_inputs(keep, input_ids.shape[1], self.embed.positional, self.mask)
        hidden = self.encoder(self.embed(input_ids, inputs.q_positions), inputs)
        return self.head(hidden) if self.head is not None else hidden
