"""Position-wise feed-forward networks: ReLU (the paper), GELU, SiLU, SwiGLU, GeGLU; with their
ONNX lowerings."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_kit.core.graph_writer import GraphWriter
from transformer_kit.core.layer_lowerings import gelu_onnx, silu_onnx


class FeedForward(nn.Module):
    """linear(d_model -> d_ff) -> activation -> dropout -> linear(d_ff -> d_model)."""

    def __init__(self, d_model: int, d_ff: int, dropout: float, activation: nn.Module,
                 bias: bool = True) -> None:
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff, bias=bias)
        self.activation = activation
        self.dropout = nn.Dropout(dropout)
        self.linear2 = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        """x (batch, len, d_model) -> (batch, len, d_model)."""
        return self.linear2(self.dropout(self.activation(self.linear1(x))))


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)) (Shazeer 2020), as in Llama; with ``alpha``, ``limit`` and
    ``up_offset`` the clamped form of gpt-oss's experts:
    ``g = min(gate(x), limit)``, ``u = clamp(up(x), -limit, limit)``,
    ``down(g * sigmoid(alpha * g) * (u + up_offset))`` (alpha 1.702, limit 7, up_offset 1).

    ``forward(x) == gated(gate(x), up(x))``: the contract of the ``"gate_up"`` lowering, under
    which the export computes gate and up as one product over their concatenated weights.

    Args:
        d_model, d_ff, dropout: sizes (gate, up (d_ff, d_model); down (d_model, d_ff)).
        bias: whether gate, up and down have biases.
        alpha: the sigmoid's gain (1: silu).
        limit: the clamp of gate (above) and up (both sides); None: none.
        up_offset: added to the (clamped) up before the product (0: none).
    """

    def __init__(self, d_model: int, d_ff: int, dropout: float, bias: bool = False,
                 alpha: float = 1.0, limit: float | None = None, up_offset: float = 0.0) -> None:
        super().__init__()
        for name, value in (("alpha", alpha), ("up_offset", up_offset)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, float))
                                  or not 0 < limit < math.inf):
            raise ValueError(f"limit must be positive (the clamp bound) or null, got {limit!r}")
        self.gate = nn.Linear(d_model, d_ff, bias=bias)
        self.up = nn.Linear(d_model, d_ff, bias=bias)
        self.down = nn.Linear(d_ff, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)
        self.alpha, self.up_offset = float(alpha), float(up_offset)
        self.limit = None if limit is None else float(limit)

    @property
    def clamped(self) -> bool:
        """Whether this is the clamped form (any of alpha, limit, up_offset not the default)."""
        return self.alpha != 1.0 or self.limit is not None or self.up_offset != 0.0

    def forward(self, x: Tensor) -> Tensor:
        """x (batch, len, d_model) -> (batch, len, d_model)."""
        return self.gated(self.gate(x), self.up(x))

    def gated(self, gate: Tensor, up: Tensor) -> Tensor:
        """gate, up (batch, len, d_ff) -> (batch, len, d_model)."""
        if not self.clamped:
            return self.down(self.dropout(F.silu(gate) * up))
        if self.limit is not None:
            gate = gate.clamp(max=self.limit)
            up = up.clamp(min=-self.limit, max=self.limit)
        return self.down(self.dropout(gate * torch.sigmoid(gate * self.alpha) * (up + self.up_offset)))


class GeGLU(SwiGLU):
    """down(gelu(gate(x)) * up(x)) (Shazeer 2020), as T5 v1.1 and Flan-T5 (``gated-gelu``, the
    tanh approximation: ``approximate="tanh"``)."""

    def __init__(self, d_model: int, d_ff: int, dropout: float, bias: bool = False,
                 approximate: str = "tanh") -> None:
        if approximate not in ("none", "tanh"):
            raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
        super().__init__(d_model, d_ff, dropout, bias)
        self.approximate = approximate

    def gated(self, gate: Tensor, up: Tensor) -> Tensor:
        """gate, up (batch, len, d_ff) -> (batch, len, d_model)."""
        return self.down(self.dropout(F.gelu(gate, approximate=self.approximate) * up))


def relu_feedforward(d_model: int, d_ff: int, dropout: float, bias: bool = True) -> FeedForward:
    return FeedForward(d_model, d_ff, dropout, nn.ReLU(), bias=bias)


def gelu_feedforward(d_model: int, d_ff: int, dropout: float, bias: bool = True,
                     approximate: str = "none") -> FeedForward:
    if approximate not in ("none", "tanh"):
        raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
    return FeedForward(d_model, d_ff, dropout, nn.GELU(approximate=approximate), bias=bias)


def silu_feedforward(d_model: int, d_ff: int, dropout: float, bias: bool = True) -> FeedForward:
    return FeedForward(d_model, d_ff, dropout, nn.SiLU(), bias=bias)


#: Hugging Face activation names -> the feedforward component (and parameters) computing them.
HF_ACTIVATIONS: dict[str, dict] = {
    "relu": {"name": "relu"},
    "gelu": {"name": "gelu"},
    "gelu_new": {"name": "gelu", "approximate": "tanh"},
    "gelu_pytorch_tanh": {"name": "gelu", "approximate": "tanh"},
    "gelu_fast": {"name": "gelu", "approximate": "tanh"},
    "silu": {"name": "silu"},
    "swish": {"name": "silu"},
}


def feedforward_for_activation(activation: str, model_type: str) -> dict:
    """The feedforward config entry for a checkpoint's activation function name."""
    from transformer_kit.core.errors import CheckpointError

    if activation not in HF_ACTIVATIONS:
        raise CheckpointError(f"{model_type}: activation {activation!r} is not supported; supported: "
                              f"{', '.join(HF_ACTIVATIONS)}.")
    return dict(HF_ACTIVATIONS[activation])


# -- ONNX ------------------------------------------------------------------------------------------
def feedforward_onnx(g: GraphWriter, ff: FeedForward, x):
    """linear2(activation(linear1(x))): x (batch, len, d_model) -> same."""
    return g.linear(ff.linear2, g.call(ff.activation, g.linear(ff.linear1, x)))


def clamped_swiglu_onnx(g: GraphWriter, ff: SwiGLU, gate, up):
    """The clamped SwiGLU's product before ``down``: min(gate, limit) * sigmoid(alpha * it)
    * (clamp(up, -limit, limit) + up_offset)."""
    if ff.limit is not None:
        gate = g.op.Min(gate, g.constant(ff.limit))
        up = g.op.Clip(up, g.constant(-ff.limit), g.constant(ff.limit))
    activated = g.op.Mul(gate, g.op.Sigmoid(g.op.Mul(gate, g.constant(ff.alpha))))
    return g.op.Mul(activated, g.op.Add(up, g.constant(ff.up_offset)) if ff.up_offset else up)


def gated_onnx(g: GraphWriter, ff: SwiGLU, x):
    """down(activation(gate(x)) * up(x)), gate and up one product in a generating model."""
    gate, up = g.linears([ff.gate, ff.up], x)
    if isinstance(ff, GeGLU):
        return g.linear(ff.down, g.op.Mul(gelu_onnx(g, gate, ff.approximate), up))
    if ff.clamped:
        return g.linear(ff.down, clamped_swiglu_onnx(g, ff, gate, up))
    return g.linear(ff.down, g.op.Mul(silu_onnx(g, gate), up))
