"""Weights read for verification's PyTorch reference, kept between its passes up to a budget.

A streamed (or bfloat16) model's reference reads each large layer's weights as it runs and
drops them after, so every pass of the verification (two forward shapes, decoding steps,
generation, top-1 agreement) would read and convert the whole checkpoint again.
:class:`KeptWeights` keeps what it reads, while a budget of bytes allows, as read (float32: a
kept bfloat16 copy would be converted again on every pass); later passes use them as they are.
The budget is half the memory that the export's estimated peak leaves free, so keeping never
makes an export that fits not fit.
"""

from __future__ import annotations

import torch
from torch import Tensor

from transformer_kit.core.memory import available_memory
from transformer_kit.export.memory_estimate import estimate
from transformer_kit.export.weight_writer import WeightSource


class KeptWeights:
    """A :class:`WeightSource` over ``source`` that keeps up to ``budget`` bytes of what it
    loads (the first tensors read, in the order the model reads them)."""

    def __init__(self, source: WeightSource, budget: int) -> None:
        self.source, self.budget = source, max(0, budget)
        self.kept: dict[str, Tensor] = {}
        self.kept_bytes = 0

    def load(self, name: str) -> Tensor:
        if name in self.kept:
            return self.kept[name]
        tensor = self.source.load(name)
        if self.kept_bytes < self.budget:
            size = tensor.numel() * tensor.element_size()
            if self.kept_bytes + size <= self.budget:
                self.kept[name] = tensor
                self.kept_bytes += size
        return tensor


def reference_source(source: WeightSource, model: torch.nn.Module, quantize: object,
                     dtype: str) -> WeightSource:
    """``source`` for the verification of ``model``'s export, keeping what half the memory
    left free by the estimated peak allows (nothing where the free memory is unknown)."""
    available = available_memory()
    if available is None:
        return source
    return KeptWeights(source, (available - estimate(model, quantize, dtype).verifying) // 2)
