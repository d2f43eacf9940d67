"""Encoder/decoder layers: post-norm (the paper, seeds), pre-norm (GPT-2, Llama), parallel
(GPT-NeoX, GPT-J: the sub-layers read the block's input side by side), post-sublayer-norm
(OLMo2: each sub-layer's output normed before the residual) and sandwich (Gemma 2 and 3: a
norm before and after each sub-layer).

Every block takes ``residual_scale`` (1.0): what each sub-layer adds to the residual stream is
multiplied by it first (Granite's residual_multiplier: x = x + scale * sublayer(norm(x))).

Each block's ONNX lowering follows its forward, call for call: ``x`` (batch, len, d_model) and
the attention inputs as graph values, the sub-layers written by ``g.call``.
"""

from __future__ import annotations

import math

from torch import Tensor, nn

from transformer_kit.core.graph_writer import GraphWriter
from transformer_kit.core.interfaces import AttentionInputs, Block, NormFactory


class _Layer(Block):
    def __init__(self, d_model: int, dropout: float, self_attention: nn.Module,
                 cross_attention: nn.Module | None, feedforward: nn.Module,
                 make_norm: NormFactory, residual_scale: float = 1.0) -> None:
        super().__init__()
        if (isinstance(residual_scale, bool) or not isinstance(residual_scale, (int, float))
                or not math.isfinite(residual_scale) or residual_scale <= 0):
            raise ValueError(f"residual_scale must be a positive number (what multiplies each "
                             f"sub-layer's output before the residual; 1.0: none), got {residual_scale!r}")
        self.residual_scale = float(residual_scale)
        self.self_attention = self_attention
        self.cross_attention = cross_attention
        self.feedforward = feedforward
        self.self_norm = make_norm()
        self.cross_norm = make_norm() if cross_attention is not None else None
        self.ff_norm = make_norm()
        self.self_dropout = nn.Dropout(dropout)
        self.cross_dropout = nn.Dropout(dropout)
        self.ff_dropout = nn.Dropout(dropout)

    def scaled(self, x: Tensor) -> Tensor:
        """A sub-layer's output (batch, len, d_model) times ``residual_scale`` (untouched at 1)."""
        return x if self.residual_scale == 1.0 else x * self.residual_scale


class PostNormBlock(_Layer):
    """x = norm(x + dropout(sublayer(x))) for each sub-layer ("Add & Norm", the paper)."""

    def forward(self, x: Tensor, self_inputs: AttentionInputs,
                cross_inputs: AttentionInputs | None = None) -> Tensor:
        x = self.self_norm(x + self.scaled(self.self_dropout(self.self_attention(x, self_inputs))))
        if self.cross_attention is not None:
            x = self.cross_norm(x + self.scaled(self.cross_dropout(self.cross_attention(x, cross_inputs))))
        return self.ff_norm(x + self.scaled(self.ff_dropout(self.feedforward(x))))


class PreNormBlock(_Layer):
    """x = x + dropout(sublayer(norm(x))); the stack ends with a final norm."""

    needs_final_norm = True

    def forward(self, x: Tensor, self_inputs: AttentionInputs,
                cross_inputs: AttentionInputs | None = None) -> Tensor:
        x = x + self.scaled(self.self_dropout(self.self_attention(self.self_norm(x), self_inputs)))
        if self.cross_attention is not None:
            x = x + self.scaled(self.cross_dropout(self.cross_attention(self.cross_norm(x), cross_inputs)))
        return x + self.scaled(self.ff_dropout(self.feedforward(self.ff_norm(x))))


class ParallelBlock(_Layer):
    """x = x + dropout(attention(norm1(x))) [+ dropout(cross(norm_c(x)))] + dropout(ff(norm2(x))):
    every sub-layer reads the block's input, each through its own norm (GPT-NeoX's
    ``use_parallel_residual``); the stack ends with a final norm."""

    needs_final_norm = True

    def forward(self, x: Tensor, self_inputs: AttentionInputs,
                cross_inputs: AttentionInputs | None = None) -> Tensor:
        out = x + self.scaled(self.self_dropout(self.self_attention(self.self_norm(x), self_inputs)))
        if self.cross_attention is not None:
            cross = self.cross_attention(self.cross_norm(x), cross_inputs)
            out = out + self.scaled(self.cross_dropout(cross))
        return out + self.scaled(self.ff_dropout(self.feedforward(self.ff_norm(x))))


class PostSublayerNormBlock(_Layer):
    """x = x + dropout(norm(sublayer(x))) for each sub-layer: the norm on the sub-layer's output,
    inside the residual (OLMo2's post_attention_layernorm and post_feedforward_layernorm); the
    stack ends with a final norm."""

    needs_final_norm = True

    def forward(self, x: Tensor, self_inputs: AttentionInputs,
                cross_inputs: AttentionInputs | None = None) -> Tensor:
        x = x + self.scaled(self.self_dropout(self.self_norm(self.self_attention(x, self_inputs))))
        if self.cross_attention is not None:
            x = x + self.scaled(self.cross_dropout(self.cross_norm(self.cross_attention(x, cross_inputs))))
        return x + self.scaled(self.ff_dropout(self.ff_norm(self.feedforward(x))))


class SandwichBlock(_Layer):
    """x = x + dropout(post_norm(sublayer(norm(x)))) for each sub-layer: a norm before and one
    after (Gemma 2 and 3: input/post_attention and pre/post_feedforward layernorms); the stack
    ends with a final norm."""

    needs_final_norm = True

    def __init__(self, d_model: int, dropout: float, self_attention: nn.Module,
                 cross_attention: nn.Module | None, feedforward: nn.Module,
                 make_norm: NormFactory, residual_scale: float = 1.0) -> None:
        super().__init__(d_model, dropout, self_attention, cross_attention, feedforward, make_norm,
                         residual_scale)
        self.self_post_norm = make_norm()
        self.cross_post_norm = make_norm() if cross_attention is not None else None
        self.ff_post_norm = make_norm()

    def forward(self, x: Tensor, self_inputs: AttentionInputs,
                cross_inputs: AttentionInputs | None = None) -> Tensor:
        attended = self.self_attention(self.self_norm(x), self_inputs)
        x = x + self.scaled(self.self_dropout(self.self_post_norm(attended)))
        if self.cross_attention is not None:
            attended = self.cross_attention(self.cross_norm(x), cross_inputs)
            x = x + self.scaled(self.cross_dropout(self.cross_post_norm(attended)))
        return x + self.scaled(self.ff_dropout(self.ff_post_norm(self.feedforward(self.ff_norm(x)))))


# -- ONNX: each block's arrangement as the export writes it (dropout is the identity there) --------
def _scaled(g: GraphWriter, block: _Layer, x):
    return x if block.residual_scale == 1.0 else g.op.Mul(x, block.residual_scale)


def post_norm_onnx(g: GraphWriter, block: PostNormBlock, x, self_inputs, cross_inputs=None):
    x = g.call(block.self_norm, g.op.Add(x, _scaled(g, block, g.call(block.self_attention, x, self_inputs))))
    if block.cross_attention is not None:
        attended = g.call(block.cross_attention, x, cross_inputs)
        x = g.call(block.cross_norm, g.op.Add(x, _scaled(g, block, attended)))
    return g.call(block.ff_norm, g.op.Add(x, _scaled(g, block, g.call(block.feedforward, x))))


def pre_norm_onnx(g: GraphWriter, block: PreNormBlock, x, self_inputs, cross_inputs=None):
    attended = g.call(block.self_attention, g.call(block.self_norm, x), self_inputs)
    x = g.op.Add(x, _scaled(g, block, attended))
    if block.cross_attention is not None:
        attended = g.call(block.cross_attention, g.call(block.cross_norm, x), cross_inputs)
        x = g.op.Add(x, _scaled(g, block, attended))
    return g.op.Add(x, _scaled(g, block, g.call(block.feedforward, g.call(block.ff_norm, x))))


def parallel_onnx(g: GraphWriter, block: ParallelBlock, x, self_inputs, cross_inputs=None):
    out = g.op.Add(x, _scaled(g, block, g.call(block.self_attention, g.call(block.self_norm, x),
                                               self_inputs)))
    if block.cross_attention is not None:
        cross = g.call(block.cross_attention, g.call(block.cross_norm, x), cross_inputs)
        out = g.op.Add(out, _scaled(g, block, cross))
    return g.op.Add(out, _scaled(g, block, g.call(block.feedforward, g.call(block.ff_norm, x))))


def post_sublayer_norm_onnx(g: GraphWriter, block: PostSublayerNormBlock, x, self_inputs, cross_inputs=None):
    attended = g.call(block.self_norm, g.call(block.self_attention, x, self_inputs))
    x = g.op.Add(x, _scaled(g, block, attended))
    if block.cross_attention is not None:
        attended = g.call(block.cross_norm, g.call(block.cross_attention, x, cross_inputs))
        x = g.op.Add(x, _scaled(g, block, attended))
    return g.op.Add(x, _scaled(g, block, g.call(block.ff_norm, g.call(block.feedforward, x))))


def sandwich_onnx(g: GraphWriter, block: SandwichBlock, x, self_inputs, cross_inputs=None):
    attended = g.call(block.self_attention, g.call(block.self_norm, x), self_inputs)
    x = g.op.Add(x, _scaled(g, block, g.call(block.self_post_norm, attended)))
    if block.cross_attention is not None:
        attended = g.call(block.cross_attention, g.call(block.cross_norm, x), cross_inputs)
        x = g.op.Add(x, _scaled(g, block, g.call(block.cross_post_norm, attended)))
    fed = g.call(block.feedforward, g.call(block.ff_norm, x))
    return g.op.Add(x, _scaled(g, block, g.call(block.ff_post_norm, fed)))
