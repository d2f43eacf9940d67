"""The interfaces a component implements, one per kind, and what its factory receives.

A factory is called with the keyword arguments it names from the model's context below plus
the parameters the config gives it (``{name: rotary, base: 500000}``).

=============  ==============================================================================
kind           factory context (take the ones you need)            returns
=============  ==============================================================================
attention      head_dim, num_heads                                  :class:`AttentionKernel`
positional     d_model, head_dim, num_heads, max_len                :class:`PositionalEncoding`
mask           (none)                                               :class:`AttentionMask`
feedforward    d_model, d_ff, dropout                               ``nn.Module`` (B,L,D)->(B,L,D)
norm           d_model                                              ``nn.Module`` (B,L,D)->(B,L,D)
qk_norm        head_dim, num_heads, num_kv_heads, d_model           ``nn.Module`` (q, k)->(q, k)
pooling        d_model                                              ``nn.Module`` (B,L,D), real
                                                                    (B,L) bool -> (B,D)
block          role, d_model, dropout, self_attention,              :class:`Block`
               cross_attention, feedforward, make_norm
logits_proc.   vocab_size, eos_ids, num_beams, min_tokens_to_keep,  ``decoding.LogitsProcessor``
               tokenizer, max_new_tokens, do_sample
=============  ==============================================================================

``qk_norm`` is optional (none by default). It sees self-attention's projections before the heads
are split and turned by rotary, q (B, L, num_heads * head_dim) and k (B, L, num_kv_heads *
head_dim), and returns both in those shapes.

``pooling`` is optional (encoders only). It turns the last hidden states (B, L, D) into one
vector per row (B, D), reading only the positions whose ``real`` is True (real tokens, and not
the prompt when the sentence embedding excludes it); a row with no kept position gives zeros.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor, nn


@dataclass
class LayerCache:
    """One layer's cached keys and values, plain tensors (exportable as graph inputs/outputs).

    key, value: (batch, kv_heads, past_len, head_dim); replaced by past + new after a call.
    cross_key, cross_value: (batch, kv_heads, src_len, head_dim), computed once per input.
    """

    key: Tensor
    value: Tensor
    cross_key: Tensor | None = None
    cross_value: Tensor | None = None


@dataclass
class AttentionWeights:
    """A call's request for the attention probabilities of some attention modules (Whisper's
    alignment heads, for word timestamps): each module in ``of`` records its softmax of the
    scaled, masked scores, (batch, heads, q_len, k_len) float32, in ``found`` by the module's
    identity (tensors in PyTorch, graph values in an export)."""

    of: list[nn.Module]
    found: dict[int, Any] = field(default_factory=dict)

    def wants(self, module: nn.Module) -> bool:
        return any(wanted is module for wanted in self.of)

    def record(self, module: nn.Module, weights: Any) -> None:
        self.found[id(module)] = weights

    def of_module(self, module: nn.Module) -> Any:
        """What ``module`` recorded (a module of ``of`` the call did not reach: KeyError)."""
        return self.found[id(module)]


@dataclass
class AttentionInputs:
    """What an attention call needs besides its input; built once per stack call.

    mask: (batch, 1, q_len, k_len) bool, True = may attend, or None.
    q_positions: (batch, q_len) int64; k_positions: (batch, k_len) int64 (self-attention).
    bias: (batch, heads, q_len, k_len) additive score bias, or None.
    positional: the encoding whose ``rotate`` applies to q and k (self-attention only).
    memory: (batch, src_len, d_model) encoder output, for cross-attention.
    cache: this layer's cache, or None for uncached calls.
    restriction: the mask component of self-attention where ``mask`` is None because the
        attention op applies what it declares itself (an export's step graph over a shared
        cache buffer: the mask's ``causal`` lowering).
    weights: the attention probabilities to record, or None (the usual call: none).
    """

    mask: Tensor | None
    q_positions: Tensor | None = None
    k_positions: Tensor | None = None
    bias: Tensor | None = None
    positional: PositionalEncoding | None = None
    memory: Tensor | None = None
    cache: LayerCache | None = None
    restriction: AttentionMask | None = None
    weights: AttentionWeights | None = None


class AttentionKernel(nn.Module):
    """Combines q, k and v; projections and grouped KV heads live in the core.

    ``forward(q, k, v, mask=None, bias=None)``: q (batch, heads, q_len, head_dim), k and v
    (batch, heads, k_len, head_dim | v_dim), mask broadcastable to (batch, heads, q_len, k_len)
    bool with True = may attend, bias an additive score bias of the same shape. Returns
    (batch, heads, q_len, v_dim). A row with no visible key returns zeros.
    """

    #: The factor on q . k scores, or None for 1/sqrt(head_dim). A kernel whose component
    #: declares the ``"attention"`` lowering must compute with exactly this scale.
    scale: float | None = None
    #: c in c * tanh(score / c), bounding the scaled scores before the mask (Gemma 2), or
    #: None for none; a kernel declaring the ``"attention"`` lowering computes it exactly.
    softcap: float | None = None

    def forward(  # pragma: no cover - interface
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
        bias: Tensor | None = None,
    ) -> Tensor:
        raise NotImplementedError

    def sink_logits(self) -> Tensor | None:
        """A learned logit per query head (num_heads,) joining each softmax's denominator as a
        key without a value (gpt-oss's attention sinks), or None: the fused attention lowering
        has no such key, so a kernel with sinks exports by its own lowering."""
        return None


@dataclass(frozen=True)
class RotaryScaling:
    """What the ``"rotary"`` lowering reads of a rotary encoding besides ``rotary_dim`` and
    ``inv_freq``: how its frequencies and angles are stretched past the training length.

    Args:
        long_from: longrope: a call whose positions pass this many uses the module's
            ``long_inv_freq`` buffer (rotary_dim / 2,) instead of ``inv_freq``; None: no switch.
        attention_factor: cos and sin are multiplied by it (yarn, longrope); 1.0: plain.
    """

    long_from: int | None = None
    attention_factor: float = 1.0


class PositionalEncoding(nn.Module):
    """Position information, at up to three points; each method is optional.

    Positions are (batch, len) int64 tensors, so left padding and cached decoding are exact.
    """

    #: Largest number of positions the encoding can represent, or None when unbounded.
    max_positions: int | None = None

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        """x (batch, len, d_model) -> x with positions added (sinusoidal, learned)."""
        return x

    def rotate(self, x: Tensor, positions: Tensor) -> Tensor:
        """x (batch, heads, len, head_dim) -> x rotated by position (rotary); q and k alike."""
        return x

    def score_bias(self, q_positions: Tensor, k_positions: Tensor) -> Tensor | None:
        """Additive score bias (batch, heads, q_len, k_len) from positions (ALiBi), or None."""
        return None

    def token_type_table(self) -> nn.Embedding | None:
        """BERT's token-type embeddings (types, d_model), whose rows of a call's token types
        ``embed`` adds (row 0 where it is given none), or None: the model takes no types."""
        return None

    def rotary_scaling(self) -> RotaryScaling:
        """An encoding declaring the ``"rotary"`` lowering: its frequencies' stretch (plain by
        default)."""
        return RotaryScaling()


class AttentionMask:
    """Self-attention mask from positions: (batch, q_len), (batch, k_len) -> (batch, 1, q_len,
    k_len) bool (True = may attend), or None for no restriction. Padding is added by the core."""

    #: A mask that declares the ``causal`` lowering (``Component.lowerings``) lets each query see
    #: the keys at its own position and the ``window - 1`` before it (None: every earlier one).
    window: int | None = None

    def __call__(self, q_positions: Tensor, k_positions: Tensor) -> Tensor | None:
        raise NotImplementedError  # pragma: no cover - interface


class Block(nn.Module):
    """One encoder or decoder layer: attention, feed-forward, norms and residuals arranged.

    ``forward(x, self_inputs, cross_inputs=None)`` with x (batch, len, d_model); the block
    passes ``self_inputs`` to ``self.self_attention`` and ``cross_inputs`` to
    ``self.cross_attention`` (decoder layers of encoder-decoder models only).
    """

    #: True when the stack must end with a norm (pre-norm layers leave the residual unnormed).
    needs_final_norm: bool = False
    self_attention: nn.Module
    cross_attention: nn.Module | None

    def forward(  # pragma: no cover - interface
        self, x: Tensor, self_inputs: AttentionInputs, cross_inputs: AttentionInputs | None = None
    ) -> Tensor:
        raise NotImplementedError


NormFactory = Callable[[], nn.Module]
