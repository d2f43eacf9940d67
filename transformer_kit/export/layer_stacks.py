"""Which stack of a model can be traced with a few layers and repeated in the graph.

Tracing costs about half a second per layer and per graph (torch.export's symbolic shapes and
decompositions dominate), so a 24- or 32-layer model spent most of its export there. The layers
of a stack are one module repeated, so the exporter traces the model with :data:`TRACED_LAYERS`
layers (:func:`truncated`) and ``layer_replication.extend_layers`` repeats the last of them in
the graph. :func:`repeatable_stack` first compares every layer after the first with the second
(module types, attributes, parameter shapes, buffer values, hooks) and their layer variants
(``layer_types``: the masks and positions they attend with): a stack whose layers differ
anywhere is traced whole.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

TRACED_LAYERS = 3  # layer 0 (which also computes what all layers share), and two periods
_MODULE_INTERNALS = frozenset(vars(nn.Module()))


def stack_name(model: nn.Module) -> str | None:
    """The attribute holding the one stack of a decoder-only or encoder-only model."""
    return {"decoder": "decoder", "encoder": "encoder"}.get(getattr(model, "architecture", ""))


def repeatable_stack(model: nn.Module) -> str | None:
    """The stack's attribute name when it has more than :data:`TRACED_LAYERS` layers and every
    layer after the first is the second one again (weights aside); otherwise ``None``."""
    name = stack_name(model)
    layers = getattr(getattr(model, name, None), "layers", None) if name else None
    if not isinstance(layers, nn.ModuleList) or len(layers) <= TRACED_LAYERS:
        return None
    variants = getattr(getattr(model, name), "variants", None)
    if variants is not None and len(set(variants.layer_types[1:])) > 1:
        return None
    template = _signature(layers[1])
    if all(_same(_signature(layer), template) for layer in layers[2:]):
        return name
    return None


def _signature(module: nn.Module) -> list:
    """What decides the graph a module traces to, other than its weights' values."""
    parts = []
    for name, sub in module.named_modules():
        attributes = {k: v for k, v in vars(sub).items() if k not in _MODULE_INTERNALS
                      and not isinstance(v, RemovableHandle)}  # a handle: its hook counts
        hooks = {k: list(v.values()) for k, v in vars(sub).items() if "hook" in k and isinstance(v, dict)}
        parameters = [(n, tuple(p.shape), p.dtype) for n, p in sub.named_parameters(recurse=False)]
        buffers = dict(sub.named_buffers(recurse=False))
        parts.append((name, type(sub), attributes, hooks, parameters, buffers))
    return parts


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        return a.is_meta or b.is_meta or bool(torch.equal(a.detach().cpu(), b.detach().cpu()))
    if isinstance(a, nn.Module) or isinstance(b, nn.Module):
        return a is b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    try:
        return bool(a == b)
    except Exception:  # an object that cannot say: treat as different
        return a is b


@contextlib.contextmanager
def truncated(model: nn.Module, name: str | None, count: int) -> Iterator[None]:
    """``model`` with only the first ``count`` layers of its stack ``name`` while inside."""
    if name is None:
        yield
        return
    stack = getattr(model, name)
    layers = stack.layers
    stack.layers = nn.ModuleList(list(layers)[:count])
    try:
        yield
    finally:
        stack.layers = layers
