"""A test-session memo of the exporter's traces: the same skeleton traced again is a copy.

Most of the suite's time goes to ``torch.onnx.export`` tracing tiny models (about 9 s a graph on
a 2-core worker: 70 % of the workers' time), and a quarter of those traces repeated one already
made in the same worker: the same model exported float32 and int4, with and without
calibration, by two test modules. A trace depends only on the traced module (on PyTorch's
``meta`` device: structure, shapes and dtypes, never weights) and the export's arguments, so
this memo returns a copy of the first trace of the same fingerprint instead of tracing again.

The fingerprint is conservative: every submodule's class, attributes, parameter and buffer
shapes and dtypes, hooks, and the export's arguments, canonicalized recursively; a function is
its module and qualified name. Anything it cannot pin down (a class or function defined inside
a function, an object with no attributes to read, real tensor values in the arguments) and any
test that uses ``monkeypatch`` (which may swap code the fingerprint cannot see) traces afresh.
``tests/test_trace_memo.py`` checks that a memo hit writes the same ONNX bytes as a fresh trace.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import functools
import hashlib
import types
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx_ir as ir
import torch
from torch import nn


class Uncacheable(Exception):
    """The fingerprint cannot pin this value down: trace afresh."""


_MODULE_INTERNALS = {"_parameters", "_buffers", "_modules"}
_ATOMS = (type(None), bool, int, float, complex, str, bytes)


@dataclasses.dataclass
class TraceMemo:
    """Traces by fingerprint, with the counts the tests read."""

    enabled: bool = True
    traces: dict[str, ir.Model] = dataclasses.field(default_factory=dict)
    hits: int = 0
    misses: int = 0
    #: Why traces were not memoized: reason -> count.
    uncacheable: dict[str, int] = dataclasses.field(default_factory=dict)


MEMO = TraceMemo()


def _qualified(obj: Any) -> str:
    module = getattr(obj, "__module__", None)
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    if not module or not name or "<locals>" in name or "<lambda>" in name:
        raise Uncacheable(f"{obj!r} has no unique qualified name")
    return f"{module}.{name}"


class _Canon:
    """Canonical, hashable descriptions of the values a trace may depend on."""

    def __init__(self, root: nn.Module) -> None:
        self.paths = {id(m): name for name, m in root.named_modules(remove_duplicate=False)}
        self.seen: dict[int, int] = {}
        self.alive: list[Any] = []  # keeps every visited object's id unique while fingerprinting

    def __call__(self, value: Any, depth: int = 0) -> Any:
        if depth > 24:
            raise Uncacheable("nested too deep")
        if isinstance(value, _ATOMS):
            return (type(value).__name__, repr(value))
        if isinstance(value, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
            return ("torch", str(value))
        if isinstance(value, enum.Enum):
            return ("enum", _qualified(type(value)), value.name)
        if isinstance(value, torch.Tensor):
            if value.is_meta:
                return ("meta", tuple(value.shape), str(value.dtype))
            data = value.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()
            return ("tensor", tuple(value.shape), str(value.dtype), hashlib.sha256(data).hexdigest())
        if isinstance(value, np.ndarray):  # a GGUF file's blocks, kept for the writer
            data = np.ascontiguousarray(value).view(np.uint8).tobytes()
            return ("ndarray", value.shape, str(value.dtype), hashlib.sha256(data).hexdigest())
        if isinstance(value, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
            return ("op", str(value))
        if isinstance(value, nn.Module):
            if id(value) not in self.paths:
                raise Uncacheable("a module outside the traced one")
            return ("module", self.paths[id(value)])
        if isinstance(value, (list, tuple)):
            return (type(value).__name__, tuple(self(v, depth + 1) for v in value))
        if isinstance(value, (set, frozenset)):
            return ("set", tuple(sorted(repr(self(v, depth + 1)) for v in value)))
        if isinstance(value, dict):
            return ("dict", tuple((self(k, depth + 1), self(v, depth + 1)) for k, v in value.items()))
        if isinstance(value, types.MethodType):
            return ("method", self(value.__func__, depth + 1), self(value.__self__, depth + 1))
        if isinstance(value, functools.partial):
            return ("partial", self(value.func, depth + 1), self(value.args, depth + 1),
                    self(value.keywords, depth + 1))
        if isinstance(value, (type, types.FunctionType, types.BuiltinFunctionType)):
            return ("callable", _qualified(value))
        if type(value).__module__.startswith(("sympy.", "torch.utils._sympy.")):  # a Dim's bounds
            return ("sympy", repr(value))
        if id(value) in self.seen:
            return ("ref", self.seen[id(value)])
        self.seen[id(value)] = len(self.seen)
        self.alive.append(value)
        if hasattr(value, "model_dump"):  # a pydantic model: its fields
            return ("pydantic", _qualified(type(value)), self(value.model_dump(), depth + 1))
        state = getattr(value, "__dict__", None)
        if state is None:
            raise Uncacheable(f"{type(value).__name__} has no attributes to read")
        return ("object", _qualified(type(value)), self(dict(sorted(state.items())), depth + 1))


def fingerprint(module: nn.Module, args: Any, kwargs: dict) -> str:
    """A digest of everything ``torch.onnx.export(module, args, **kwargs)`` traces from;
    raises :class:`Uncacheable` where something escapes it."""
    globals_ = nn.modules.module
    if any(getattr(globals_, name) for name in dir(globals_) if name.startswith("_global_") and
           name.endswith("hooks")):
        raise Uncacheable("global module hooks")
    canon = _Canon(module)
    parts = []
    for path, sub in module.named_modules(remove_duplicate=False):
        attrs = {k: v for k, v in vars(sub).items() if k not in _MODULE_INTERNALS}
        parts.append((path, _qualified(type(sub)), canon(dict(sorted(attrs.items()))),
                      tuple((n, canon(p), p.requires_grad) for n, p in sub._parameters.items()
                            if p is not None),
                      tuple((n, canon(b)) for n, b in sub._buffers.items() if b is not None)))
    parts.append(canon(args))
    parts.append(canon(dict(sorted(kwargs.items()))))
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def _all_meta(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value.is_meta
    if isinstance(value, (list, tuple)):
        return all(_all_meta(v) for v in value)
    return value is None or isinstance(value, _ATOMS)


def _copy(model: ir.Model) -> ir.Model:
    """A clone that names new values and nodes as ``model`` would: the names a graph ever gave,
    removed ones too, stay taken (``onnx_ir``'s name authority), and the optimizer's rewrites
    name what they add from there."""
    clone = model.clone()
    graphs = [*model.graphs(), *(f.graph for f in model.functions.values())]
    copies = [*clone.graphs(), *(f.graph for f in clone.functions.values())]
    for graph, copied in zip(graphs, copies, strict=True):  # the same order: the same structure
        copied._name_authority = copy.deepcopy(graph._name_authority)
    return clone


def memoized(export: Callable) -> Callable:
    """``torch.onnx.export`` that answers a dynamo export of a ``meta`` skeleton (what
    ``trace_graph`` asks) from :data:`MEMO` when its fingerprint was traced before."""

    @functools.wraps(export)
    def export_or_copy(model, args=(), *rest, **kwargs):
        if not (MEMO.enabled and not rest and kwargs.get("dynamo") and isinstance(model, nn.Module)
                and _all_meta(args)):
            return export(model, args, *rest, **kwargs)
        try:
            key = fingerprint(model, args, kwargs)
        except Exception as why:  # whatever the fingerprint cannot read: trace afresh
            MEMO.uncacheable[str(why)] = MEMO.uncacheable.get(str(why), 0) + 1
            return export(model, args, *rest, **kwargs)
        if key in MEMO.traces:
            MEMO.hits += 1
            return types.SimpleNamespace(model=_copy(MEMO.traces[key]))
        program = export(model, args, *rest, **kwargs)
        MEMO.misses += 1
        MEMO.traces[key] = _copy(program.model)
        return program

    return export_or_copy
