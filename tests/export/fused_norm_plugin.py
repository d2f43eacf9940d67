"""A plugin whose norm calls a custom torch op, with ONNX translations supplied by plugins.

``components`` contributes the norm; ``translation`` maps the op to ONNX's RMSNormalization;
``wrong_translation`` gets its epsilon wrong, which verification must catch.
"""

from __future__ import annotations

import types

import torch
from onnxscript import opset23 as op
from torch import Tensor, nn

import transformer_kit as tk


@torch.library.custom_op("transformer_kit_tests::rms_norm", mutates_args=())
def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


@rms_norm.register_fake
def _(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return torch.empty_like(x)


class FusedRMSNorm(nn.Module):
    def __init__(self, d_model: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(d_model))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return torch.ops.transformer_kit_tests.rms_norm(x, self.weight, self.eps)


def rms_norm_onnx(x, weight, eps: float):
    return op.RMSNormalization(x, weight, axis=-1, epsilon=eps)


def wrong_rms_norm_onnx(x, weight, eps: float):
    return op.RMSNormalization(x, weight, axis=-1, epsilon=1.0)  # ignores eps: a plausible bug


def _plugin(name: str, **hooks) -> types.SimpleNamespace:
    return types.SimpleNamespace(__name__=name, **{k: tk.hookimpl(v) for k, v in hooks.items()})


def components() -> types.SimpleNamespace:
    return _plugin("fused_norm", transformer_kit_components=lambda: [
        tk.Component("norm", "fused_rmsnorm", FusedRMSNorm, description="custom-op RMSNorm")])


def translation() -> types.SimpleNamespace:
    return _plugin("fused_norm_onnx", transformer_kit_onnx_translations=lambda: {
        torch.ops.transformer_kit_tests.rms_norm.default: rms_norm_onnx})


def wrong_translation() -> types.SimpleNamespace:
    return _plugin("fused_norm_wrong_onnx", transformer_kit_onnx_translations=lambda: {
        torch.ops.transformer_kit_tests.rms_norm.default: wrong_rms_norm_onnx})
