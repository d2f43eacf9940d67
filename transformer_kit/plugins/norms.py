"""Normalisation layers: LayerNorm (the paper) and RMSNorm."""

from __future__ import annotations

from torch import nn


def _check_eps(eps: float) -> None:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
        raise ValueError(f"eps must be a positive number, got {eps!r}")


def layer_norm(d_model: int, eps: float = 1e-5, bias: bool = True) -> nn.LayerNorm:
    _check_eps(eps)
    return nn.LayerNorm(d_model, eps=eps, bias=bias)


def rms_norm(d_model: int, eps: float = 1e-6) -> nn.RMSNorm:
    _check_eps(eps)
    return nn.RMSNorm(d_model, eps=eps)
