"""The graph builder: what every lowering writes its ONNX nodes with.

An export builds each graph from the model's components: the kit's own modules (attention's
projections, the stacks, the heads) and every registered component that brings a lowering
(``tk.Lowering``, the ``transformer_kit_lowerings`` hook) write their nodes through one
:class:`GraphBuilder` ``g``::

    def rms_norm(g, norm, x):                      # x: (batch, len, d_model)
        return g.op.RMSNormalization(x, g.weight(norm, "weight"), epsilon=norm.eps, axis=-1)

- ``g.op.<OpType>(*inputs, **attributes)`` writes one node (``_domain=`` for another domain,
  ``_outputs=n`` for several outputs); an input may be a Value, None (an omitted optional
  input), an int or list of ints (an int64 constant), a float (a constant of the activations'
  type) or a numpy array.
- ``g.weight(module, "weight")`` is a parameter (streamed into ``weights.data`` when the export
  writes it, never copied here) or a buffer (its values) of ``module``, by its state-dict name.
- ``g.call(child, *inputs)`` lowers a sub-module (a component's own lowering, the kit's, or
  the component traced alone when it has none); ``g.linear(linear, x)`` is an ``nn.Linear``.
- ``g.float_type`` is the activations' element type (float32, or float16 for a half-precision
  export); ``g.config`` the model's config.

Nodes and values are named by the module path that wrote them
(``decoder.layers.3.self_attention.q_proj/MatMul``), so a graph opened in Netron or an
onnxruntime profile points at the component. The values the kit hands a lowering carry their
shapes (symbolic axes such as ``batch`` and ``len``) and element types.

The nodes are onnx-ir's (``onnx_ir``), written directly rather than through onnxscript's
``@script`` functions: the weight writer and onnxscript's optimizer work on onnx-ir graphs, a node
is made without parsing or tracing anything, and its name is the builder's to choose.
"""

from __future__ import annotations

import contextlib
import functools
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx_ir as ir
import torch
from torch import nn

from transformer_kit.core.errors import ExportError
from transformer_kit.core.registry import Registry
from transformer_kit.core.registry_entries import RegisteredLowering, component_of

FLOAT, FLOAT16, INT64, BOOL = ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.INT64, ir.DataType.BOOL
INT32 = ir.DataType.INT32
#: The ONNX IR version each opset needs (the oldest that holds it: onnxruntime reads them all).
IR_VERSIONS = {18: 8, 19: 9, 20: 9, 21: 10, 22: 10, 23: 11}
_TORCH_TYPES = {torch.float32: FLOAT, torch.float16: FLOAT16, torch.bfloat16: FLOAT,
                torch.float64: FLOAT, torch.int64: INT64, torch.int32: ir.DataType.INT32,
                torch.bool: BOOL}

#: Ops whose output has their (first) input's shape and element type.
_UNARY = frozenset({"Relu", "Sigmoid", "Tanh", "Neg", "Abs", "Erf", "Sqrt", "Exp", "Log", "Sin", "Cos",
                    "Not", "Identity", "Softmax", "Gelu", "LayerNormalization", "RMSNormalization",
                    "RotaryEmbedding", "Reciprocal", "Round", "Floor", "Ceil"})
#: Elementwise ops over inputs broadcast together: the first input's type, or bool.
_BROADCAST = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "And", "Or", "Where"})
_COMPARISONS = frozenset({"Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"})


def _broadcast(shapes: list[ir.Shape | None]) -> list | None:
    """Numpy's broadcast of symbolic shapes, or None when one is unknown or they conflict."""
    if any(shape is None for shape in shapes):
        return None
    rank = max(len(shape) for shape in shapes)
    result = []
    for axis in range(rank):
        dims = {shape[axis - rank + len(shape)] for shape in shapes if axis - rank + len(shape) >= 0}
        dims = {d.value if isinstance(d, ir.SymbolicDim) else d for d in dims} - {1}
        if len(dims) > 1:
            return None
        result.append(dims.pop() if dims else 1)
    return result


@dataclass(frozen=True)
class CacheLengths:
    """A step graph's row lengths over a cache buffer shared by past and present: ``seqlens``
    (batch,) int32, each row's length after the step - 1, and ``total`` () int32, the longest."""

    seqlens: ir.Value
    total: ir.Value


#: A lowering of the kit's own: ``function(g, obj, *inputs)``.
Lowered = Callable[..., Any]


class Ops:
    """``g.op.MatMul(a, b)``: one node of the op type named by the attribute."""

    def __init__(self, builder: GraphBuilder) -> None:
        self._builder = builder

    def __getattr__(self, op_type: str) -> Callable[..., Any]:
        if not op_type[:1].isupper():
            raise AttributeError(op_type)
        return functools.partial(self._builder.node, op_type)


class GraphBuilder:
    """Writes one graph of an export (see the module's docstring). ``g.FLOAT``, ``g.FLOAT16``,
    ``g.INT64`` and ``g.BOOL`` are the element types a lowering names (``Cast(x, to=g.FLOAT)``).

    Args:
        model: the model exported (its parameters give the weights' names and shapes; a
            streamed model's are on the ``meta`` device, and nothing here reads their values).
        name: the graph's name (``model``, ``decoder_step``, ``encoder``).
        float_type: the activations' element type.
        opset: the default domain's opset.
        registry: where the components' lowerings are found.
        fallback: ``fallback(g, obj, method, args)``: a call no lowering writes (the
            component traced alone).
        core: ``core(obj, method)``: the kit's own lowering of ``obj.<method>`` (of its modules,
            of torch's layers by exact type, an interface's inherited no-op), or None.
    """

    FLOAT, FLOAT16, INT64, BOOL = FLOAT, FLOAT16, INT64, BOOL

    def __init__(self, model: nn.Module, name: str, *, float_type: ir.DataType, opset: int,
                 registry: Registry, fallback: Callable[..., Any],
                 core: Callable[[object, str], Lowered | None]) -> None:
        self.model = model
        self.config = model.config
        self.float_type = float_type
        self.opset = opset
        self.graph = ir.Graph([], [], nodes=[], opset_imports={"": opset}, name=name)
        self.op = Ops(self)
        #: Whether a module's products over one input are packed into one (q/k/v, gate/up): in a
        #: generating model, whose steps read each weight once per token; an encoder's single
        #: compute-bound graph keeps them apart.
        self.packs_products = getattr(model, "architecture", None) != "encoder"
        self._registry, self._fallback, self._core = registry, fallback, core
        self._paths = {id(m): path for path, m in model.named_modules(remove_duplicate=False)}
        # a tied weight by its last name (the output head's, as torch's exporter names it)
        self._parameter_names = {id(p): n for n, p in model.named_parameters(remove_duplicate=False)}
        #: The rows' lengths where the graph's cache is one buffer shared by past and present
        #: (its attention writes the new columns in place), else None.
        self.cache_lengths: CacheLengths | None = None
        self._scope = ""
        self._counts: Counter[str] = Counter()
        self._values: dict[tuple, ir.Value] = {}  # weights and constants, written once each

    # -- nodes ----------------------------------------------------------------------------------
    def node(self, op_type: str, *inputs: Any, _domain: str = "", _outputs: int = 1,
             **attributes: Any) -> Any:
        """Write one node; its output Value (a tuple of them for ``_outputs`` > 1)."""
        name = self._unique(f"{self._scope}/{op_type}")
        values = [self._input(v) for v in inputs]
        while values and values[-1] is None:  # trailing omitted inputs are left out
            values.pop()
        outputs = [ir.Value(name=f"{name}/output_{i}") for i in range(_outputs)]
        attributes = {k: v for k, v in attributes.items() if v is not None}
        if _domain and _domain not in self.graph.opset_imports:
            self.graph.opset_imports[_domain] = 1
        self.graph.append(ir.node(op_type, values, attributes, domain=_domain, outputs=outputs,
                                  name=name))
        if not _domain and values and values[0] is not None:
            self._infer(op_type, values, attributes, outputs[0])
        return outputs[0] if _outputs == 1 else tuple(outputs)

    def _infer(self, op_type: str, inputs: list, attributes: dict, output: ir.Value) -> None:
        """The shape and element type of elementwise ops' outputs, for the lowerings that read
        them (onnxruntime infers its own)."""
        first = inputs[0]
        if op_type in _UNARY:
            self.shaped(output, first.shape, first.dtype)
        elif op_type == "Cast":
            self.shaped(output, first.shape, ir.DataType(attributes["to"]))
        elif op_type in _BROADCAST or op_type in _COMPARISONS:
            dtype = BOOL if op_type in _COMPARISONS else (inputs[1] if op_type == "Where" else first).dtype
            self.shaped(output, _broadcast([v.shape if v is not None else None for v in inputs]), dtype)

    def node_name(self, base: str) -> str:
        """A node name unique in the graph: ``{module path}/{base}``, as ``g.op`` names nodes."""
        return self._unique(f"{self._scope}/{base}")

    def _unique(self, name: str) -> str:
        self._counts[name] += 1
        return name if self._counts[name] == 1 else f"{name}_{self._counts[name] - 1}"

    def _input(self, value: Any) -> ir.Value | None:
        if value is None or isinstance(value, ir.Value):
            return value
        return self.constant(value)

    # -- constants and weights ------------------------------------------------------------------
    def constant(self, value: Any, dtype: ir.DataType | None = None) -> ir.Value:
        """A constant (an initializer held in the graph, or in weights.data when large): ints
        and lists of ints are int64, floats the activations' type unless ``dtype`` says."""
        if isinstance(value, torch.Tensor):
            value = value.detach().cpu()
            value = (value.float() if value.dtype == torch.bfloat16 else value).numpy()
        if dtype is None:
            if isinstance(value, float) or (isinstance(value, (list, tuple)) and value
                                             and isinstance(value[0], float)):
                dtype = self.float_type
            elif isinstance(value, (bool, np.bool_)):
                dtype = BOOL
            elif not isinstance(value, np.ndarray):
                dtype = INT64
        array = np.asarray(value, dtype=dtype.numpy() if dtype is not None else None)
        key = ("constant", array.dtype.str, array.shape, array.tobytes())
        if key not in self._values:
            name = self._unique(f"constants/{ir.DataType.from_numpy(array.dtype).name}/{list(array.shape)}")
            tensor = ir.tensor(array, name=name)
            value = ir.Value(name=name, shape=ir.Shape(array.shape), type=ir.TensorType(tensor.dtype),
                             const_value=tensor)
            self.graph.register_initializer(value)
            self._values[key] = value
        return self._values[key]

    def weight(self, module: nn.Module, name: str, dtype: ir.DataType | None = None) -> ir.Value:
        """Parameter or buffer ``name`` of ``module`` as a graph value: a parameter by its
        state-dict name (a tied weight by its last name), without its values (the export's
        weight writer streams them into weights.data), in the activations' type if floating (in
        ``dtype`` through a ``Cast``, as a half-precision model's ``weight.float()``); a buffer
        with its values, in ``dtype`` (floating ones in the activations' type by default)."""
        tensor = getattr(module, name, None)
        if not isinstance(tensor, torch.Tensor):
            raise ExportError(f"{type(module).__name__} has no parameter or buffer {name!r}; a "
                              "lowering reads the tensors its module holds.")
        floating = tensor.dtype.is_floating_point
        stored = self.float_type if floating else _TORCH_TYPES.get(tensor.dtype, INT64)
        dtype = dtype or stored
        if id(tensor) not in self._parameter_names:
            if floating:
                tensor = tensor.float()
            return self.constant(tensor.numpy(force=True).astype(dtype.numpy()), dtype)
        full_name = self._parameter_names[id(tensor)]
        if ("weight", full_name) not in self._values:
            value = ir.Value(name=full_name, shape=ir.Shape(tuple(tensor.shape)), type=ir.TensorType(stored))
            self.graph.initializers[full_name] = value  # no value: the weight writer streams it
            self._values["weight", full_name] = value
        value = self._values["weight", full_name]
        if dtype == stored:
            return value
        with self.scope(full_name):
            return self.shaped(self.op.Cast(value, to=dtype), value.shape, dtype)

    # -- shapes -----------------------------------------------------------------------------------
    def input(self, name: str, dtype: ir.DataType, shape: Sequence[int | str]) -> ir.Value:
        """A graph input (symbolic axes by name)."""
        value = ir.Value(name=name, shape=ir.Shape(shape), type=ir.TensorType(dtype))
        self.graph.inputs.append(value)
        return value

    def output(self, value: ir.Value, name: str) -> None:
        """``value`` becomes graph output ``name`` (through an Identity when it already is one,
        or is a graph input or constant)."""
        if value in self.graph.outputs or value in self.graph.inputs or value.const_value is not None:
            shape, dtype = value.shape, value.dtype
            value = self.shaped(self.op.Identity(value), shape, dtype)
        value.name = name
        self.graph.outputs.append(value)

    @staticmethod
    def shaped(value: ir.Value, shape: Sequence[int | str | None] | None,
               dtype: ir.DataType | None = None) -> ir.Value:
        """``value`` with its shape (and element type) recorded; returns it."""
        if shape is not None:
            value.shape = ir.Shape(shape)
        if dtype is not None:
            value.type = ir.TensorType(dtype)
        return value

    # -- modules ----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def scope(self, path: str) -> Iterator[None]:
        """Name what is written meanwhile after ``path``."""
        outer, self._scope = self._scope, path
        try:
            yield
        finally:
            self._scope = outer

    def path_of(self, obj: object, default: str) -> str:
        """``obj``'s module path in the model (``default`` for an object that is no module of it)."""
        return self._paths.get(id(obj), default)

    def call(self, obj: object, *inputs: Any, method: str = "forward", path: str | None = None) -> Any:
        """``obj.<method>(*inputs)`` written into the graph: by its component's lowering, the
        kit's own, or (when neither writes it) the component traced alone. ``path`` names the
        nodes for an object that is no module of the model (a mask)."""
        where = path or self.path_of(obj, f"{self._scope}.{type(obj).__name__}".lstrip("."))
        with self.scope(where):
            lowering = self.lowering(obj, method)
            if lowering is not None:
                result = lowering(self, obj, *inputs)
            else:
                result = self._fallback(self, obj, method, inputs)
        return self._interface_shapes(obj, method, inputs, result)

    def _interface_shapes(self, obj: object, method: str, inputs: tuple, result: Any) -> Any:
        """``result`` with the shapes its kind's interface gives, where the lowering left them
        out: a norm, feed-forward, block or embedding keeps its input's shape (and the
        activations' type), a kernel gives q's, a q/k norm q's and k's."""
        entry = component_of(obj)
        kind = entry.component.kind if entry is not None else (
            "norm" if isinstance(obj, (nn.LayerNorm, nn.RMSNorm)) else None)
        # a kernel's output has q's shape (its values' width is q's in every kind here)
        keeps = kind in ("norm", "feedforward", "block", "attention") or (
            kind == "positional" and method != "score_bias")
        results = result if kind == "qk_norm" and isinstance(result, tuple) else (result,)
        for value, given in zip(results, inputs, strict=False):
            if (keeps or kind == "qk_norm") and isinstance(value, ir.Value) and value.shape is None \
                    and isinstance(given, ir.Value) and given.shape is not None:
                self.shaped(value, given.shape, self.float_type)
        return result

    def lowering(self, obj: object, method: str) -> Lowered | None:
        """What writes ``obj.<method>``: the lowering registered for the component that made
        ``obj``, else the kit's own for its exact type, else None."""
        found = self.registered_lowering(obj)
        if found is not None and method in found.lowering.methods():
            return found.lowering.methods()[method]
        return self._core(obj, method)

    def registered_lowering(self, obj: object) -> RegisteredLowering | None:
        """The lowering registered for the component that made ``obj`` (None: none, or ``obj``
        was not made by a registered component)."""
        entry = component_of(obj)
        if entry is None:
            return None
        return self._registry.lowering(entry.component.kind, entry.component.name)

    def linear(self, linear: nn.Linear, x: ir.Value) -> ir.Value:
        """``linear(x)``: x (..., in) -> (..., out), as ``MatMul`` by the transposed weight (the
        weight writer stores it transposed) and ``Add`` of the bias."""
        return self.call(linear, x)

    def linears(self, linears: Sequence[nn.Linear], x: ir.Value) -> list[ir.Value]:
        """``[l(x) for l in linears]`` over one input: one product over the weights concatenated
        (in one pass: a generating model's q/k/v and gate/up) when :attr:`packs_products`, each
        output split off after; else one product each."""
        if not self.packs_products or len(linears) == 1:
            return [self.linear(one, x) for one in linears]
        paths = [self.path_of(one, "linear") for one in linears]
        common = paths[0].rsplit(".", 1)[0]
        names = ",".join(p.rsplit(".", 1)[-1] for p in paths)
        with self.scope(f"{common}.{{{names}}}"):
            weight = self.op.Concat(*[self.weight(one, "weight") for one in linears], axis=0)
            width = sum(one.out_features for one in linears)
            self.shaped(weight, (width, linears[0].in_features), self.float_type)
            product = self.matmul_transposed(x, weight, linears[0].in_features, width)
            if all(one.bias is not None for one in linears):
                product = self.op.Add(product, self.op.Concat(*[self.weight(one, "bias") for one in linears],
                                                              axis=0))
            elif any(one.bias is not None for one in linears):
                return [self.linear(one, x) for one in linears]
            parts = self.op.Split(product, [one.out_features for one in linears], axis=-1,
                                  _outputs=len(linears))
        shape = list(x.shape) if x.shape is not None else None
        return [self.shaped(part, None if shape is None else [*shape[:-1], one.out_features],
                            self.float_type) for part, one in zip(parts, linears, strict=True)]

    def matmul_transposed(self, x: ir.Value, weight: ir.Value, k: int, n: int) -> ir.Value:
        """x (..., k) @ weight.T, weight (n, k): the weight's ``Transpose`` is folded into the
        bytes the writer stores (or into ``MatMulNBits``, which reads rows)."""
        transposed = self.shaped(self.op.Transpose(weight, perm=[1, 0]), (k, n), weight.dtype)
        product = self.op.MatMul(x, transposed)
        shape = list(x.shape) if x.shape is not None else None
        return self.shaped(product, None if shape is None else [*shape[:-1], n], self.float_type)

    # -- the whole graph ---------------------------------------------------------------------------
    def model_ir(self) -> ir.Model:
        """The graph as an ONNX model (IR version for the opset)."""
        return ir.Model(self.graph, ir_version=IR_VERSIONS[self.opset], producer_name="transformer-kit")
