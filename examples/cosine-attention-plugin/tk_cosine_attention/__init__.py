"""Cosine-similarity attention for transformer_kit, registered through the entry point
``transformer_kit`` (see this package's pyproject.toml)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

import transformer_kit as tk
from transformer_kit.interfaces import AttentionKernel
from transformer_kit.masks import masked_softmax

__all__ = ["CosineAttention", "transformer_kit_components"]


class CosineAttention(AttentionKernel):
    """softmax(temperature * cos(q, k) + bias) v over the keys the mask allows.

    q (batch, heads, q_len, head_dim), k and v (batch, heads, k_len, head_dim); a row with no
    visible key gives zeros. The temperature is a learned scalar, initialised to ``temperature``.
    """

    def __init__(self, temperature: float = 10.0) -> None:
        super().__init__()
        if not temperature > 0:
            raise ValueError(f"temperature must be positive, got {temperature!r}")
        self.temperature = torch.nn.Parameter(torch.tensor(float(temperature)))

    def weights(self, q: Tensor, k: Tensor, mask: Tensor | None = None,
                bias: Tensor | None = None) -> Tensor:
        """Attention weights (batch, heads, q_len, k_len), float32."""
        q, k = F.normalize(q.float(), dim=-1), F.normalize(k.float(), dim=-1)
        return masked_softmax(self.temperature * (q @ k.transpose(-2, -1)), mask, bias)

    def forward(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
                bias: Tensor | None = None) -> Tensor:
        return (self.weights(q, k, mask, bias) @ v.float()).to(v.dtype)


@tk.hookimpl
def transformer_kit_components() -> list[tk.Component]:
    return [tk.Component("attention", "cosine", CosineAttention, provides={"score_bias"},
                         description="cosine-similarity attention with a learned temperature")]
