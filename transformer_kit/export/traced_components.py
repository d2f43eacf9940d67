"""The fallback: a component that brings no lowering is traced alone and inlined.

When the graph builder meets a call no lowering writes (a third-party component without a
``tk.Lowering``, or one whose lowering leaves out the point called), :class:`ComponentTracer`
traces that one object's method with ``torch.onnx.export`` at the call's inputs: a copy of the
module on the ``meta`` device (its buffers' values kept, its weights never copied), example
inputs with the call's symbolic axes dynamic, the plugins' ONNX translations of custom ops. The
traced graph is an ONNX function of the call's inputs and the module's weights; it is inlined at
the call, its nodes named under the component's path, its weights read from the export's
weights as every other product's.

Tracing costs seconds, so it is paid once per distinct component: a trace is kept for the
export, keyed by what the component computes (its class, its settings, its parameters' shapes,
its buffers' values) and the kinds of its inputs, and reused for every layer and graph that
calls it again. The step graph is built first, so a trace is made at the most general shapes
(new tokens after a past) and serves the other graphs, whose calls are special cases of them.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import re
import time
from collections.abc import Hashable
from typing import Any

import onnx_ir as ir
import torch
from torch import Tensor, nn
from torch.export import Dim

from transformer_kit.checkpoints.streaming import drop_guards
from transformer_kit.core.errors import ExportError
from transformer_kit.core.interfaces import AttentionInputs, LayerCache
from transformer_kit.core.registry_entries import COMPONENT_ATTRIBUTE, component_of, origin
from transformer_kit.export.graph_passes import quiet_exporter, tidy

#: Example sizes of the graphs' symbolic axes: each distinct, past + new = total (a step's keys).
EXAMPLE_SIZES = {"batch": 2, "len": 5, "new": 3, "past": 4, "total": 7, "src_len": 6, "kept": 3}
_SPARE_SIZES = (11, 13, 17, 19, 23, 29, 31, 37)
_TORCH_TYPES = {ir.DataType.FLOAT: torch.float32, ir.DataType.FLOAT16: torch.float16,
                ir.DataType.INT64: torch.int64, ir.DataType.INT32: torch.int32, ir.DataType.BOOL: torch.bool}


def first_line(exc: Exception) -> str:
    """The first line of an exception's message, without the exporter's colours."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def bind_buffers(model: ir.Model, buffers: dict[str, Tensor]) -> None:
    """Give the traced buffers' initializers their values (by state-dict name); take the
    weights' (meta) values away: the export's own weights take their place."""
    for key, value in model.graph.initializers.items():
        raw = getattr(value.const_value, "raw", None)
        if key in buffers:  # real values: folded where torch's export folded them
            array = buffers[key].detach().cpu()
            array = (array.float() if array.dtype == torch.bfloat16 else array).numpy()
            value.const_value = ir.Tensor(array.astype(value.dtype.numpy()) if value.dtype else array,
                                          name=key)
        elif isinstance(raw, Tensor) and raw.is_meta:
            value.const_value = None


@dataclasses.dataclass
class _Trace:
    """One traced call: its ONNX model (inputs ``in{i}``, outputs ``out{j}``, weights without
    values named by the wrapper's state-dict names), the symbolic pattern of its inputs, and
    where its outputs go (the method's result, then the caches' new tensors)."""

    model: ir.Model
    pattern: tuple
    result: Any  # None, "tensor", or the number of tensors of a tuple
    cache_fields: list[tuple[int, str]]


class _Call(nn.Module):
    """``target.<method>(*args)`` over a flat list of tensors (``args`` rebuilt from ``spec``);
    returns the result's tensors, then each cache's fields after the call."""

    def __init__(self, target: Any, method: str, spec: Any, extras: list[nn.Module]) -> None:
        super().__init__()
        if isinstance(target, nn.Module):
            self.target = target
        else:
            self.__dict__["target"] = target  # a mask: no module
        self.method, self.spec = method, spec
        self.extras = nn.ModuleList(extras)
        self.cache_fields: list[tuple[int, str]] = []
        self.result: Any = None

    def forward(self, tensors: list[Tensor]) -> tuple[Tensor, ...]:
        caches: list[LayerCache] = []
        args = _rebuild(self.spec, tensors, list(self.extras), caches)
        function = self.target if self.method == "forward" and not isinstance(self.target, nn.Module) \
            else getattr(self.target, self.method)
        while args and args[-1] is None:  # a call without its trailing optional inputs
            args = args[:-1]
        result = function(*args)
        outputs: list[Tensor] = []
        if isinstance(result, Tensor):
            self.result, outputs = "tensor", [result]
        elif isinstance(result, tuple):
            self.result, outputs = len(result), list(result)
        else:
            self.result = None
        self.cache_fields = []
        for i, cache in enumerate(caches):
            for name in ("key", "value", "cross_key", "cross_value"):
                if getattr(cache, name) is not None:
                    self.cache_fields.append((i, name))
                    outputs.append(getattr(cache, name))
        return tuple(outputs)


def _flatten(value: Any, leaves: list[ir.Value], extras: list[Any]) -> Any:
    """A spec of ``value`` with each graph value replaced by its index in ``leaves`` (and each
    module an attention input carries by its index in ``extras``)."""
    if isinstance(value, ir.Value):
        leaves.append(value)
        return ("leaf", len(leaves) - 1)
    if isinstance(value, (AttentionInputs, LayerCache)):
        fields = {f.name: _flatten(getattr(value, f.name), leaves, extras)
                  for f in dataclasses.fields(value)}
        return (type(value), fields)
    if isinstance(value, nn.Module):
        extras.append(value)
        return ("extra", len(extras) - 1)
    if value is None or isinstance(value, (int, float, bool, str)):
        return ("plain", value)
    raise ExportError(f"A component traced alone takes graph values, attention inputs and plain "
                      f"numbers; it was given a {type(value).__name__}.")


def _rebuild(spec: Any, tensors: list[Tensor], extras: list[nn.Module], caches: list) -> Any:
    if isinstance(spec, list):
        return [_rebuild(s, tensors, extras, caches) for s in spec]
    kind, content = spec
    if kind == "leaf":
        return tensors[content]
    if kind == "extra":
        return extras[content]
    if kind == "plain":
        return content
    built = kind(**{name: _rebuild(s, tensors, extras, caches) for name, s in content.items()})
    if isinstance(built, LayerCache):
        caches.append(built)
    return built


def _symbol(dim: Any) -> str | int | None:
    if isinstance(dim, int):
        return dim
    value = getattr(dim, "value", dim)
    return value if isinstance(value, str) else None


def _pattern(leaves: list[ir.Value]) -> tuple:
    """Each input's element type and axes: static sizes as they are, symbolic ones numbered by
    first appearance (``("s", 0)``), so two calls compare by which axes they tie together."""
    names: dict[str, int] = {}
    pattern = []
    for value in leaves:
        if value.shape is None or value.dtype is None:
            raise ExportError(f"A component traced alone needs its inputs' shapes and types; "
                              f"{value.name!r} has none recorded. Record them with g.shaped(...) "
                              "in the lowering that made it.")
        axes = []
        for dim in value.shape:
            symbol = _symbol(dim)
            if symbol is None:
                raise ExportError(f"Input {value.name!r} of a component traced alone has an axis of "
                                  "unknown size; record its shape with g.shaped(...).")
            axes.append(("s", names.setdefault(symbol, len(names))) if isinstance(symbol, str) else symbol)
        pattern.append((int(value.dtype), tuple(axes)))
    return tuple(pattern)


def _finer(traced: tuple, current: tuple) -> bool:
    """Whether ``current`` ties together at least the axes ``traced`` does (the same types and
    static sizes): a trace made at ``traced`` then computes ``current`` too."""
    if len(traced) != len(current):
        return False
    mapping: dict[int, Any] = {}
    for (t_type, t_axes), (c_type, c_axes) in zip(traced, current, strict=True):
        if t_type != c_type or len(t_axes) != len(c_axes):
            return False
        for t, c in zip(t_axes, c_axes, strict=True):
            if isinstance(t, tuple):
                if mapping.setdefault(t[1], c) != c:
                    return False
            elif t != c:
                return False
    return True


def _plain(value: Any) -> Hashable:
    """A setting's value as a key: plain data as it is, anything else by identity."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return tuple(_plain(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((str(k), _plain(v)) for k, v in value.items()))
    return ("object", id(value))


def fingerprint(obj: Any) -> Hashable:
    """What ``obj`` computes, as a key: its class, settings, parameters' shapes and buffers'
    values, and its children's, recursively."""
    parts: list[Any] = [type(obj)]
    settings = dict(vars(obj)) if hasattr(obj, "__dict__") else {}
    if isinstance(obj, nn.Module):
        parts += [(n, tuple(p.shape), str(p.dtype)) for n, p in obj.named_parameters(recurse=False)]
        parts += [(n, tuple(b.shape), str(b.dtype), hashlib.sha256(
            b.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes()).hexdigest())
            for n, b in obj.named_buffers(recurse=False)]
        parts += [(n, fingerprint(c)) for n, c in obj.named_children()]
        settings = {k: v for k, v in settings.items() if not k.startswith("_") and k != "training"}
    settings.pop(COMPONENT_ATTRIBUTE, None)
    parts += [(k, _plain(v)) for k, v in sorted(settings.items())]
    return tuple(parts)


def _meta_copy(obj: Any, half: bool) -> tuple[Any, dict[str, Tensor]]:
    """A copy of ``obj`` whose parameters are on the ``meta`` device (never copied) in the
    export's float type, and its buffers' values by name."""
    if not isinstance(obj, nn.Module):
        return copy.deepcopy(obj), {}
    memo: dict[int, Any] = {id(p): nn.Parameter(torch.empty_like(p, device="meta"), requires_grad=False)
                            for p in obj.parameters()}
    copied = copy.deepcopy(obj, memo)
    drop_guards(copied)  # a streamed model's layers refuse to run outside the export
    buffers = {name: b.detach().clone() for name, b in copied.named_buffers()}
    copied.to("meta")
    copied.half() if half else copied.float()
    return copied.eval(), buffers


def _example(value: ir.Value, sizes: dict[str, int]) -> tuple[Tensor, dict[int, Any]]:
    shape, dynamic = [], {}
    for axis, dim in enumerate(value.shape):
        symbol = _symbol(dim)
        if isinstance(symbol, str):
            if symbol not in sizes:
                sizes[symbol] = _SPARE_SIZES[len([s for s in sizes if s not in EXAMPLE_SIZES])]
            shape.append(sizes[symbol])
            dynamic[axis] = Dim.AUTO
        else:
            shape.append(symbol)
    dtype = _TORCH_TYPES.get(value.dtype)
    if dtype is None:
        raise ExportError(f"A component traced alone takes float, int and bool inputs; "
                          f"{value.name!r} is {value.dtype}.")
    return torch.empty(shape, dtype=dtype, device="meta"), dynamic


class ComponentTracer:
    """Traces, once each, the components an export's lowerings do not write (see the module's
    docstring). ``traced``: for the report, each component traced and why."""

    def __init__(self, opset: int, translations: dict) -> None:
        self.opset, self.translations = opset, translations
        self._traces: dict[Hashable, list[_Trace]] = {}
        #: Component label -> why it was traced, how often and how long it took.
        self.traced: dict[str, str] = {}
        self._seconds: dict[str, float] = {}
        self._counts: dict[str, int] = {}

    def call(self, g: Any, obj: Any, method: str, inputs: tuple) -> Any:
        """``obj.<method>(*inputs)`` in ``g``'s graph, by its trace (made now if new)."""
        leaves: list[ir.Value] = []
        extras: list[Any] = []
        spec = [_flatten(v, leaves, extras) for v in inputs]
        pattern = _pattern(leaves)
        key = (fingerprint(obj), method, repr(spec), tuple(fingerprint(e) for e in extras),
               int(g.float_type))
        trace = next((t for t in self._traces.get(key, []) if _finer(t.pattern, pattern)), None)
        if trace is None:
            label, reason = self._describe(g, obj, method)
            start = time.perf_counter()
            trace = self._trace(g, obj, method, spec, leaves, extras, pattern, label)
            self._traces.setdefault(key, []).append(trace)
            self._seconds[label] = self._seconds.get(label, 0.0) + time.perf_counter() - start
            self._counts[label] = self._counts.get(label, 0) + 1
            traces = self._counts[label]
            self.traced[label] = (f"{reason}; traced {traces} time{'s' if traces > 1 else ''} "
                                  f"({self._seconds[label]:.1f} s)")
        return _inline(g, trace, obj, leaves, extras, inputs)

    @staticmethod
    def _describe(g: Any, obj: Any, method: str) -> tuple[str, str]:
        entry = component_of(obj)
        if entry is None:
            return (type(obj).__qualname__,
                    "not made by a registered component, and the kit has no lowering for its class")
        component = entry.component
        label = f"{component.kind} {component.name!r} ({origin(entry.plugin, entry.distribution)})"
        found = g.registered_lowering(obj) is not None
        return label, (f"its lowering writes no {method}" if found else "no lowering registered")

    def _trace(self, g: Any, obj: Any, method: str, spec: list, leaves: list[ir.Value],
               extras: list[Any], pattern: tuple, label: str) -> _Trace:
        half = g.float_type == ir.DataType.FLOAT16
        target, buffers = _meta_copy(obj, half)
        copies = []
        for i, extra in enumerate(extras):
            copied, extra_buffers = _meta_copy(extra, half)
            copies.append(copied)
            buffers.update({f"extras.{i}.{n}": b for n, b in extra_buffers.items()})
        buffers = {(f"target.{n}" if not n.startswith("extras.") and isinstance(obj, nn.Module) else n): b
                   for n, b in buffers.items()}
        wrapper = _Call(target, method, spec, copies).eval()
        sizes = dict(EXAMPLE_SIZES)
        examples, dynamic = zip(*[_example(v, sizes) for v in leaves], strict=True) if leaves else ((), ())
        with quiet_exporter():
            try:
                with torch.no_grad():
                    wrapper([*examples])  # the result's structure and the caches' fields, on meta
                outputs = (0 if wrapper.result is None else 1 if wrapper.result == "tensor"
                           else wrapper.result)
                count = outputs + len(wrapper.cache_fields)
                if count == 0:
                    return _Trace(None, pattern, None, [])
                program = torch.onnx.export(
                    wrapper, ([*examples],), dynamo=True, opset_version=self.opset,
                    dynamic_shapes=([*dynamic],), input_names=[f"in{i}" for i in range(len(leaves))],
                    output_names=[f"out{j}" for j in range(count)],
                    custom_translation_table=self.translations or None, verbose=False, optimize=False)
            except Exception as exc:
                raise ExportError(
                    f"{label} has no lowering, and tracing its {method} alone failed: "
                    f"{type(exc).__name__}: {first_line(exc)}. Give it a lowering (tk.Lowering, "
                    "docs/plugins.md), or if it calls a custom op, map the op to ONNX through the "
                    "transformer_kit_onnx_translations hook."
                ) from exc
            model = program.model
            bind_buffers(model, buffers)
            tidy(model)
        return _Trace(model, pattern, wrapper.result, list(wrapper.cache_fields))


def _original_tensor(obj: Any, extras: list[Any], name: str) -> tuple[nn.Module, str]:
    """The module and attribute of the original parameter a trace names ``target.a.b.weight``."""
    root, _, rest = name.partition(".")
    owner = obj
    if root == "extras":
        index, _, rest = rest.partition(".")
        owner = extras[int(index)]
    path, _, leaf = rest.rpartition(".")
    return (owner.get_submodule(path) if path else owner), leaf


def _inline(g: Any, trace: _Trace, obj: Any, leaves: list[ir.Value], extras: list[Any],
            inputs: tuple) -> Any:
    """Write ``trace``'s nodes into ``g``'s graph at the call's inputs; returns the call's result
    (and puts the caches' new tensors into the call's caches)."""
    if trace.model is None:
        return None
    graph = trace.model.graph
    mapping: dict[ir.Value, ir.Value] = dict(zip(graph.inputs, leaves, strict=True))
    for name, value in graph.initializers.items():
        if value.const_value is None:  # a weight of the module: the export's own
            module, leaf = _original_tensor(obj, extras, name)
            mapping[value] = g.weight(module, leaf)
        else:
            mapping[value] = g.constant(value.const_value.numpy())
    for domain, version in trace.model.opset_imports.items():
        if domain:
            g.graph.opset_imports.setdefault(domain, version)
    symbols = _traced_symbols(graph.inputs, leaves)
    for node in graph:
        name = g.node_name(node.name or node.op_type)
        outputs = [ir.Value(name=f"{name}/{out.name}", type=out.type,
                            shape=_mapped_shape(out.shape, symbols)) for out in node.outputs]
        attributes = [ir.Attr(a.name, a.type, a.value) for a in node.attributes.values()]
        g.graph.append(ir.Node(node.domain, node.op_type, [mapping.get(v) if v is not None else None
                                                              for v in node.inputs],
                               attributes, overload=node.overload, outputs=outputs, name=name))
        mapping.update(zip(node.outputs, outputs, strict=True))
    produced = [mapping[v] for v in graph.outputs]
    count = 0 if trace.result is None else 1 if trace.result == "tensor" else trace.result
    result = (None if trace.result is None else produced[0] if trace.result == "tensor"
              else tuple(produced[:count]))
    caches = _caches(inputs)
    for (index, field), value in zip(trace.cache_fields, produced[count:], strict=True):
        setattr(caches[index], field, value)
    return result


def _caches(inputs: tuple) -> list[LayerCache]:
    """The caches among the call's inputs, in the order the wrapper rebuilt them."""
    found: list[LayerCache] = []

    def walk(value: Any) -> None:
        if isinstance(value, (list, tuple)):
            for v in value:
                walk(v)
        elif isinstance(value, AttentionInputs):
            for f in dataclasses.fields(value):
                walk(getattr(value, f.name))
        elif isinstance(value, LayerCache):
            found.append(value)
    walk(inputs)
    return found


def _traced_symbols(traced_inputs: list[ir.Value], leaves: list[ir.Value]) -> dict[str, Any]:
    """The trace's symbolic axis names -> the call's (by the inputs that carry them)."""
    symbols: dict[str, Any] = {}
    for traced, value in zip(traced_inputs, leaves, strict=True):
        if traced.shape is None or value.shape is None:
            continue
        for t, v in zip(traced.shape, value.shape, strict=False):
            name = _symbol(t)
            if isinstance(name, str):
                symbols.setdefault(name, _symbol(v))
    return symbols


def _mapped_shape(shape: ir.Shape | None, symbols: dict[str, Any]) -> ir.Shape | None:
    if shape is None:
        return None
    dims = []
    for dim in shape:
        name = _symbol(dim)
        dims.append(symbols.get(name) if isinstance(name, str) else name)
    return ir.Shape(dims) if all(d is not None for d in dims) else None


