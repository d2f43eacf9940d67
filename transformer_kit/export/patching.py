"""What the export-time rewrites share: whether a component declares a lowering, and swapping
modules' forwards (with their weights packed into one constant) only while the export traces."""

from __future__ import annotations

import contextlib
import types
from collections.abc import Callable, Iterator

import torch
from torch import nn


def declares(model: nn.Module, kind: str, lowering: str) -> bool:
    """Whether ``model``'s component of ``kind`` declares ``lowering``."""
    entry = getattr(model, "components", {}).get(kind)
    return entry is not None and lowering in entry.component.lowerings


@contextlib.contextmanager
def patched_forwards(modules: list[nn.Module], forward: Callable, packed: str,
                     linears: Callable[[nn.Module], list[nn.Linear]] | None) -> Iterator[int]:
    """While active, each of ``modules`` runs ``forward`` (bound to it) and holds buffers
    ``{packed}_weight`` (sum of outs, in) and ``{packed}_bias`` (or None): the weights and biases
    of ``linears(module)`` concatenated along the output dimension, or both None without
    ``linears``. As a constant, the exporter folds the weight's transpose and the quantizers see
    it (a concatenation traced from the parameters would run at load time, and stay in float).
    Yields how many modules were patched; every module gets its own forward back and loses the
    buffers on exit, whatever happened."""
    try:
        for module in modules:
            weight = bias = None
            if linears is not None:
                layers = linears(module)
                with torch.no_grad():
                    weight = torch.cat([layer.weight for layer in layers])
                    if layers[0].bias is not None:
                        bias = torch.cat([layer.bias for layer in layers])
            module.register_buffer(f"{packed}_weight", weight, persistent=False)
            module.register_buffer(f"{packed}_bias", bias, persistent=False)
            module.forward = types.MethodType(forward, module)
        yield len(modules)
    finally:
        for module in modules:
            module.__dict__.pop("forward", None)
            for name in (f"{packed}_weight", f"{packed}_bias"):
                module._buffers.pop(name, None)
