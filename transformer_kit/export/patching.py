"""What the export-time rewrites share: whether a component declares a lowering, and swapping
modules' forwards (with their weights packed into one constant) only while the export traces."""

from __future__ import annotations

import contextlib
import types
from collections.abc import Callable, Iterator

import torch
from torch import nn


def entries(model: nn.Module, kind: str) -> list:
    """``model``'s registered components of ``kind``: the top-level one and each layer
    variant's (empty when it has none)."""
    found = [getattr(model, "components", {}).get(kind)]
    found += [kinds.get(kind) for kinds in getattr(model, "layer_components", {}).values()]
    return [entry for entry in found if entry is not None]


def declares(model: nn.Module, kind: str, lowering: str) -> bool:
    """Whether ``model``'s components of ``kind`` (the top-level one and every layer variant's)
    all declare ``lowering``."""
    found = entries(model, kind)
    return bool(found) and all(lowering in entry.component.lowerings for entry in found)


def packed_parameters(module: nn.Module, packed: str) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The weights (sum of outs, in) and biases (or None) of the linear layers a patch packs
    as ``packed`` in ``module``, concatenated along the output dimension; (None, None) when
    it packs none. Traced as a concatenation of the parameters, which the weight writer folds
    into one matrix in ``weights.data`` (so the quantizers see one constant weight)."""
    layers = module.__dict__.get(f"{packed}_linears")
    if layers is None:
        return None, None
    weight = torch.cat([layer.weight for layer in layers])
    bias = torch.cat([layer.bias for layer in layers]) if layers[0].bias is not None else None
    return weight, bias


@contextlib.contextmanager
def patched_forwards(modules: list[nn.Module], forward: Callable, packed: str,
                     linears: Callable[[nn.Module], list[nn.Linear]] | None) -> Iterator[int]:
    """While active, each of ``modules`` runs ``forward`` (bound to it), which reads the layers
    ``linears(module)`` packed into one product through :func:`packed_parameters` (``packed``
    names them; without ``linears`` it packs none). Yields how many modules were patched; every
    module gets its own forward back on exit, whatever happened."""
    try:
        for module in modules:
            module.__dict__[f"{packed}_linears"] = linears(module) if linears is not None else None
            module.forward = types.MethodType(forward, module)
        yield len(modules)
    finally:
        for module in modules:
            module.__dict__.pop("forward", None)
            module.__dict__.pop(f"{packed}_linears", None)
