"""Positional encodings: sinusoidal (the paper), learned, rotary, ALiBi, T5's relative bias, none;
each with its ONNX lowering (the points it acts at, written as the export writes them).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from transformer_kit.core.errors import InputError
from transformer_kit.core.graph_writer import GraphWriter
from transformer_kit.core.interfaces import PositionalEncoding, RotaryScaling
from transformer_kit.core.layer_lowerings import rotary_cos_sin
from transformer_kit.plugins.rope_scaling import frequencies


class NoPositions(PositionalEncoding):
    """No position information (a bag of tokens, or positions carried by the mask alone)."""


class SinusoidalPositions(PositionalEncoding):
    """PE(pos, 2i) = sin(pos / base^(2i/d_model)), PE(pos, 2i+1) = cos(...), for any length.

    ``layout="split"`` puts the sines in the first half and the cosines in the second (Marian).
    """

    def __init__(self, d_model: int, base: float = 10000.0, layout: str = "interleaved") -> None:
        super().__init__()
        if not base > 1:
            raise ValueError(f"base must be greater than 1, got {base!r}")
        if layout not in ("interleaved", "split"):
            raise ValueError(f"layout must be 'interleaved' (the paper) or 'split' (sines then "
                             f"cosines, as Marian), got {layout!r}")
        i = torch.arange(d_model)
        if layout == "split":  # feature j < d/2 is sin of frequency j, feature d/2 + j its cos
            half = (d_model + 1) // 2
            pair = torch.where(i < half, i, i - half)
            is_sin = i < half
        else:
            pair, is_sin = i // 2, i % 2 == 0
        self.register_buffer(
            "inv_freq", torch.pow(float(base), -(2 * pair).double() / d_model).float(),
            persistent=False,
        )
        self.register_buffer("is_even", is_sin, persistent=False)

    def table(self, positions: Tensor) -> Tensor:
        """positions (batch, len) -> encodings (batch, len, d_model), float32."""
        angles = positions.unsqueeze(-1).float() * self.inv_freq
        return torch.where(self.is_even, torch.sin(angles), torch.cos(angles))

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        return x + self.table(positions).to(x.dtype)


class LearnedPositions(PositionalEncoding):
    """A trained table ``nn.Embedding(offset + max_len, d_model)``: position p (counted over
    real tokens from 0) reads row ``offset + p``.

    ``token_types > 0`` adds BERT's token-type table, of which row 0 (the type of every token
    when no types are given) is added to each position. ``offset``: rows before the first
    position (RoBERTa's ``padding_idx + 1``, BART's 2).
    """

    def __init__(self, d_model: int, max_len: int, token_types: int = 0, offset: int = 0) -> None:
        super().__init__()
        for name, value in (("token_types", token_types), ("offset", offset)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
        self.max_positions, self.offset = max_len, offset
        self.table = nn.Embedding(offset + max_len, d_model)
        nn.init.normal_(self.table.weight, std=0.02)
        # BERT's segment embedding; every token is of type 0, so row 0 is added everywhere.
        self.token_type = nn.Embedding(token_types, d_model) if token_types else None
        if self.token_type is not None:
            nn.init.normal_(self.token_type.weight, std=0.02)

    def token_type_table(self) -> nn.Embedding | None:
        return self.token_type

    def embed(self, x: Tensor, positions: Tensor, token_types: Tensor | None = None) -> Tensor:
        """x (batch, len, d_model) + the rows of ``positions`` (batch, len) + the token-type
        rows of ``token_types`` (batch, len; row 0 everywhere when None)."""
        if not (torch.compiler.is_compiling() or torch.jit.is_tracing()):
            longest = int(positions.max()) + 1 if positions.numel() else 0
            if longest > self.max_positions:
                raise InputError(
                    f"Sequence reaches position {longest - 1}, but learned positions cover "
                    f"0..{self.max_positions - 1} (max_len={self.max_positions}). Shorten the "
                    "input or build the model with a larger max_len."
                )
        x = x + self.table(positions + self.offset if self.offset else positions).to(x.dtype)
        if self.token_type is not None and token_types is not None:
            x = x + self.token_type(token_types).to(x.dtype)
        elif self.token_type is not None:
            x = x + self.token_type.weight[0].to(x.dtype)
        return x


def whisper_sinusoids(length: int, channels: int, max_timescale: float = 10000.0) -> Tensor:
    """Whisper's encoder positions (length, channels) float32: sines of log-spaced timescales
    (1 to ``max_timescale`` over channels / 2 steps) in the first half, their cosines in the second."""
    increment = math.log(max_timescale) / (channels // 2 - 1)
    inv_timescales = torch.exp(-increment * torch.arange(channels // 2, dtype=torch.float64))
    angles = torch.arange(length, dtype=torch.float64)[:, None] * inv_timescales[None, :]
    return torch.cat([torch.sin(angles), torch.cos(angles)], dim=1).float()


class SinusoidalTable(LearnedPositions):
    """Whisper's encoder positions: :func:`whisper_sinusoids` of ``length`` rows (the encoder's
    positions, apart from the decoder's ``max_len``) as a fixed table (not trained), read as
    :class:`LearnedPositions` reads its rows. A table rather than a formula, so a checkpoint's
    stored values (rounded to float16 in the published ones) are used exactly as they are."""

    def __init__(self, d_model: int, length: int = 1500, max_timescale: float = 10000.0) -> None:
        if d_model % 2 or d_model < 4:
            raise ValueError(f"sinusoidal_table needs an even d_model of at least 4, got {d_model}")
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise ValueError(f"length must be a positive integer (the positions), got {length!r}")
        if not max_timescale > 1:
            raise ValueError(f"max_timescale must be greater than 1, got {max_timescale!r}")
        super().__init__(d_model, length)
        with torch.no_grad():
            self.table.weight.copy_(whisper_sinusoids(length, d_model, max_timescale))
        self.table.weight.requires_grad_(False)


class RotaryPositions(PositionalEncoding):
    """Rotary embeddings (RoFormer), rotating halves of q and k (the GPT-NeoX/Llama layout).

    Args:
        head_dim: per-head width; the rotated part must be even.
        base: frequency base.
        rotary_dim: how many leading features of each head rotate (default: all).
        scaling: how the frequencies are stretched past the training length (``{"type":
            "llama3" | "linear" | "yarn" | "longrope", ...}``, see
            :mod:`transformer_kit.plugins.rope_scaling`); None: plain.
    """

    def __init__(self, head_dim: int, base: float = 10000.0, rotary_dim: int | None = None,
                 scaling: dict | None = None) -> None:
        super().__init__()
        rotary_dim = head_dim if rotary_dim is None else rotary_dim
        if rotary_dim % 2 or not 0 < rotary_dim <= head_dim:
            raise ValueError(
                f"rotary needs an even rotary_dim in 1..head_dim ({head_dim}); got {rotary_dim}. "
                "Choose d_model / num_heads even, or set rotary_dim."
            )
        if not base > 1:
            raise ValueError(f"base must be greater than 1, got {base!r}")
        self.rotary_dim = rotary_dim
        scaled = frequencies(base, rotary_dim, scaling)
        self.register_buffer("inv_freq", scaled.inv_freq, persistent=False)
        self.register_buffer("long_inv_freq", scaled.long_inv_freq, persistent=False)  # or None
        self.original, self.attention_factor = scaled.original, scaled.attention_factor

    def rotary_scaling(self) -> RotaryScaling:
        return RotaryScaling(self.original if self.long_inv_freq is not None else None,
                             self.attention_factor)

    def cos_sin(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """positions (batch, len) -> cos, sin (batch, len, rotary_dim / 2) float32 of the angles
        (times the attention factor of yarn and longrope). longrope's long frequencies turn a
        call whose positions pass the original length, as transformers switches them."""
        inv_freq = self.inv_freq
        if self.long_inv_freq is not None:
            inv_freq = torch.where(positions.max() + 1 > self.original, self.long_inv_freq, inv_freq)
        angles = positions[..., None].float() * inv_freq
        cos, sin = angles.cos(), angles.sin()
        if self.attention_factor != 1.0:
            cos, sin = cos * self.attention_factor, sin * self.attention_factor
        return cos, sin

    def rotate(self, x: Tensor, positions: Tensor) -> Tensor:
        cos, sin = self.cos_sin(positions)  # (batch, len, rd/2)
        cos = torch.cat([cos, cos], dim=-1)[:, None].to(x.dtype)  # (batch, 1, len, rd)
        sin = torch.cat([sin, sin], dim=-1)[:, None].to(x.dtype)
        rot, rest = x[..., : self.rotary_dim], x[..., self.rotary_dim :]
        half = self.rotary_dim // 2
        rotated_half = torch.cat([-rot[..., half:], rot[..., :half]], dim=-1)
        return torch.cat([rot * cos + rotated_half * sin, rest], dim=-1)


def alibi_slopes(num_heads: int) -> list[float]:
    """The ALiBi paper's head slopes: 2^(-8/n), 2^(-16/n), ... (interleaved when n is not 2^k)."""

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    if math.log2(num_heads).is_integer():
        return power_of_two(num_heads)
    closest = 2 ** math.floor(math.log2(num_heads))
    return power_of_two(closest) + power_of_two(2 * closest)[0::2][: num_heads - closest]


class ALiBiPositions(PositionalEncoding):
    """Attention with linear biases: score bias -slope_h * |q_pos - k_pos|, no embedding."""

    def __init__(self, num_heads: int) -> None:
        super().__init__()
        self.register_buffer("slopes", torch.tensor(alibi_slopes(num_heads)), persistent=False)

    def score_bias(self, q_positions: Tensor, k_positions: Tensor) -> Tensor:
        distance = (q_positions[:, :, None] - k_positions[:, None, :]).abs().float()
        return -self.slopes[None, :, None, None] * distance[:, None]


class RelativePositionBias(PositionalEncoding):
    """T5's relative position bias: a learned table (num_buckets, num_heads) indexed by the
    bucket of each key's distance to the query, added to the scores of every self-attention
    layer (computed once per stack, as T5's first layer computes it and the others share it).

    Distances below ``num_buckets // 2`` (of the buckets per direction) have a bucket each; longer
    ones share log-spaced buckets up to ``max_distance``, and any further distance the last.
    Bidirectional (half the buckets for keys after the query) in an encoder stack, causal in a
    decoder stack (``causal`` comes from the stack; set it to override).

    Args:
        num_heads: attention heads (one bias per head); num_buckets, max_distance: as T5's
            ``relative_attention_num_buckets`` (32) and ``relative_attention_max_distance`` (128).
    """

    def __init__(self, num_heads: int, causal: bool, num_buckets: int = 32,
                 max_distance: int = 128) -> None:
        super().__init__()
        per_side = num_buckets // (1 if causal else 2)
        if isinstance(num_buckets, bool) or not isinstance(num_buckets, int) or per_side < 2:
            raise ValueError(f"num_buckets must be an integer of at least {2 if causal else 4}, "
                             f"got {num_buckets!r}")
        is_int = isinstance(max_distance, int) and not isinstance(max_distance, bool)
        if not is_int or max_distance <= per_side // 2:
            raise ValueError(f"max_distance must be an integer above {per_side // 2} (the exact "
                             f"buckets), got {max_distance!r}")
        self.causal, self.num_buckets, self.max_distance = causal, num_buckets, max_distance
        self.table = nn.Embedding(num_buckets, num_heads)
        nn.init.normal_(self.table.weight, std=num_heads ** -0.5)

    def buckets(self, relative: Tensor) -> Tensor:
        """relative (..., ) int64 key - query distances -> their buckets (T5's
        ``_relative_position_bucket``, term for term)."""
        buckets = self.num_buckets
        if self.causal:
            offset = torch.zeros_like(relative)
            distance = (-relative).clamp(min=0)
        else:
            buckets //= 2
            offset = (relative > 0).long() * buckets
            distance = relative.abs()
        exact = buckets // 2
        # log of at least 1: the small distances take the exact branch below anyway
        large = exact + (torch.log(distance.clamp(min=1).float() / exact)
                         / math.log(self.max_distance / exact) * (buckets - exact)).long()
        large = large.clamp(max=buckets - 1)
        return offset + torch.where(distance < exact, distance, large)

    def score_bias(self, q_positions: Tensor, k_positions: Tensor) -> Tensor:
        """(batch, q_len), (batch, k_len) -> (batch, heads, q_len, k_len)."""
        relative = k_positions[:, None, :] - q_positions[:, :, None]
        return self.table(self.buckets(relative)).permute(0, 3, 1, 2)


# -- ONNX: each encoding's points as the export writes them ---------------------------------------
def no_positions_onnx(g: GraphWriter, positional: PositionalEncoding, x, positions):
    """``none`` (and every encoding's inherited ``embed``): the embeddings as they are."""
    return x


def sinusoidal_onnx(g: GraphWriter, positional: SinusoidalPositions, x, positions):
    """x (batch, len, d_model) + the sin/cos table of positions (batch, len), in float32."""
    angles = g.op.Mul(g.op.Unsqueeze(g.op.Cast(positions, to=g.FLOAT), [-1]),
                      g.weight(positional, "inv_freq", g.FLOAT))
    table = g.op.Where(g.weight(positional, "is_even"), g.op.Sin(angles), g.op.Cos(angles))
    return g.op.Add(x, table if g.float_type == g.FLOAT else g.op.Cast(table, to=g.float_type))


def learned_onnx(g: GraphWriter, positional: LearnedPositions, x, positions, token_types=None):
    """x (batch, len, d_model) + the table's rows of ``positions`` (+ offset) and the token-type
    rows of ``token_types`` (batch, len; row 0 everywhere when None)."""
    rows = g.op.Add(positions, [positional.offset]) if positional.offset else positions
    x = g.op.Add(x, g.op.Gather(g.weight(positional.table, "weight"), rows, axis=0))
    if positional.token_type is None:
        return x
    types = token_types if token_types is not None else g.constant(0)
    return g.op.Add(x, g.op.Gather(g.weight(positional.token_type, "weight"), types, axis=0))


def rotary_onnx(g: GraphWriter, positional: RotaryPositions, x, positions):
    """x (batch, heads, len, head_dim) turned by position: one ``RotaryEmbedding`` op from opset
    23, the halves' turn in elementwise ops before it."""
    cos, sin = rotary_cos_sin(g, positional, positions)
    dim = positional.rotary_dim
    if g.opset >= 23:
        return g.op.RotaryEmbedding(x, cos, sin, interleaved=0, rotary_embedding_dim=dim)
    cos, sin = (g.op.Unsqueeze(t, [1]) for t in (cos, sin))  # (batch, 1, len, dim / 2)
    half = dim // 2
    first = g.op.Slice(x, [0], [half], [3])
    second = g.op.Slice(x, [half], [dim], [3])
    rest = g.op.Slice(x, [dim], [2**62], [3])
    turned = [g.op.Sub(g.op.Mul(first, cos), g.op.Mul(second, sin)),
              g.op.Add(g.op.Mul(second, cos), g.op.Mul(first, sin))]
    return g.op.Concat(*turned, rest, axis=3)


def alibi_onnx(g: GraphWriter, positional: ALiBiPositions, q_positions, k_positions):
    """(batch, heads, q_len, k_len) float32: -slope_h * |q_pos - k_pos|."""
    distance = g.op.Cast(g.op.Abs(g.op.Sub(g.op.Unsqueeze(q_positions, [2]),
                                           g.op.Unsqueeze(k_positions, [1]))), to=g.FLOAT)
    slopes = g.op.Neg(g.op.Unsqueeze(g.weight(positional, "slopes", g.FLOAT), [0, 2, 3]))
    return g.op.Mul(slopes, g.op.Unsqueeze(distance, [1]))


def relative_bias_onnx(g: GraphWriter, positional: RelativePositionBias, q_positions, k_positions):
    """(batch, heads, q_len, k_len) float32: the table's row of each key's distance bucket
    (T5's ``_relative_position_bucket``, term for term)."""
    relative = g.op.Sub(g.op.Unsqueeze(k_positions, [1]), g.op.Unsqueeze(q_positions, [2]))
    buckets = positional.num_buckets
    if positional.causal:
        offset = None
        distance = g.op.Max(g.op.Neg(relative), [0])
    else:
        buckets //= 2
        offset = g.op.Mul(g.op.Cast(g.op.Greater(relative, [0]), to=g.INT64), [buckets])
        distance = g.op.Abs(relative)
    exact = buckets // 2
    scaled = g.op.Div(g.op.Cast(g.op.Max(distance, [1]), to=g.FLOAT), g.constant(float(exact), g.FLOAT))
    logs = g.op.Div(g.op.Log(scaled), g.constant(math.log(positional.max_distance / exact), g.FLOAT))
    large = g.op.Add(g.op.Cast(g.op.Mul(logs, g.constant(float(buckets - exact), g.FLOAT)), to=g.INT64),
                     [exact])
    large = g.op.Min(large, [buckets - 1])
    bucket = g.op.Where(g.op.Less(distance, [exact]), distance, large)
    if offset is not None:
        bucket = g.op.Add(offset, bucket)
    bias = g.op.Transpose(g.op.Gather(g.weight(positional.table, "weight"), bucket, axis=0),
                          perm=[0, 3, 1, 2])
    return bias if g.float_type == g.FLOAT else g.op.Cast(bias, to=g.FLOAT)
