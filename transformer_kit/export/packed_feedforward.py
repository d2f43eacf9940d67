"""Packed gate and up: an export-time rewrite of gated feed-forward layers, undone after.

While :func:`packed_feedforward_patch` is active, every feed-forward module of a generating model
whose component declares the ``"gate_up"`` lowering computes its gate and up projections as one
product over their concatenated weights, held as one constant: one MatMul (MatMulNBits in
int4) per layer instead of two, which reads the input once and the weights in one pass (a
batch-1 int4 decoding step of the Llama benchmark shape: 1.08x, same logits to the bit, since
4-bit blocks run along the input dimension of each output column). Eager PyTorch never sees it,
and every export is verified against the unpatched model.
"""

from __future__ import annotations

import contextlib

import torch.nn.functional as F
from torch import Tensor, nn

from transformer_kit.export.patching import declares, packed_parameters, patched_forwards

#: The lowering a feed-forward component declares (see ``Component.lowerings``).
GATE_UP_LOWERING = "gate_up"


def packed_gate_up_forward(self: nn.Module, x: Tensor) -> Tensor:
    """``gated(gate(x), up(x))`` with one product: x (batch, len, d_model) -> (batch, len, d_model)."""
    gate, up = F.linear(x, *packed_parameters(self, "packed_gate_up")).split(
        [self.gate.out_features, self.up.out_features], -1)
    return self.gated(gate, up)


def _packable(module: nn.Module) -> bool:
    gate, up = getattr(module, "gate", None), getattr(module, "up", None)
    return (isinstance(gate, nn.Linear) and isinstance(up, nn.Linear)
            and gate.in_features == up.in_features and (gate.bias is None) == (up.bias is None)
            and callable(getattr(module, "gated", None)))


def packed_feedforward_patch(model: nn.Module, enabled: bool = True
                             ) -> contextlib.AbstractContextManager[int]:
    """While active, the feed-forward modules of ``model`` (a generating model whose feed-forward
    component declares ``"gate_up"``, when ``enabled``) run :func:`packed_gate_up_forward`;
    yields how many were patched. Every module gets its own forward back on exit."""
    generating = getattr(model, "architecture", None) != "encoder"
    patched = []
    if enabled and generating and declares(model, "feedforward", GATE_UP_LOWERING):
        found = (getattr(m, "feedforward", None) for m in model.modules())  # the blocks' sub-layers
        patched = [m for m in found if isinstance(m, nn.Module) and _packable(m)]
    return patched_forwards(patched, packed_gate_up_forward, "packed_gate_up", lambda m: [m.gate, m.up])
