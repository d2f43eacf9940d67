"""What a lowering writes its ONNX nodes with: the export's graph builder, as a protocol a plugin
types its lowerings by (``def my_norm_onnx(g: tk.GraphWriter, norm, x): ...``) without
importing the export layer, which it sits below.

The values a lowering receives and returns are ``onnx_ir.Value`` objects (``Value`` here), shaped
as the kind's interface shapes its tensors (:mod:`transformer_kit.core.interfaces`); docs/plugins.md
has a worked example.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # the graph's values and element types; onnx-ir comes with the torch extra
    from onnx_ir import DataType, Value
    from torch import nn

    from transformer_kit.core.config import ModelConfig


class Ops(Protocol):
    """``g.op.MatMul(a, b)``: one node of the op type named by the attribute; ``_domain=`` for
    another domain (``"com.microsoft"``), ``_outputs=n`` for several outputs; an input may be a
    Value, None (an omitted optional input), an int or a list of ints (an int64 constant), a float
    (a constant of the activations' type) or a numpy array."""

    def __getattr__(self, op_type: str) -> Any: ...


class GraphWriter(Protocol):
    """The graph builder ``g`` every lowering gets (``transformer_kit.export.graph_builder``)."""

    #: Element types a lowering names (``g.op.Cast(x, to=g.FLOAT)``).
    FLOAT: DataType
    FLOAT16: DataType
    INT64: DataType
    BOOL: DataType
    #: The activations' element type (float32, or float16 for a half-precision export).
    float_type: DataType
    #: The default domain's opset.
    opset: int
    #: The model's config.
    config: ModelConfig
    op: Ops

    def weight(self, module: nn.Module, name: str, dtype: DataType | None = None) -> Value:
        """Parameter or buffer ``name`` of ``module`` (by its state-dict name) as a graph value:
        a parameter streamed into ``weights.data`` when the export writes it, a buffer by value."""

    def constant(self, value: Any, dtype: DataType | None = None) -> Value:
        """A constant: ints and lists of ints are int64, floats the activations' type unless
        ``dtype`` says."""

    def call(self, obj: object, *inputs: Any, method: str = "forward", path: str | None = None) -> Any:
        """``obj.<method>(*inputs)`` written into the graph: by its component's lowering, the
        kit's own, or traced alone."""

    def linear(self, linear: nn.Linear, x: Value) -> Value:
        """``linear(x)``: x (..., in) -> (..., out)."""

    def linears(self, linears: Sequence[nn.Linear], x: Value) -> list[Value]:
        """``[l(x) for l in linears]`` over one input (one product in a generating model)."""

    def shaped(self, value: Value, shape: Sequence[int | str | None] | None,
               dtype: DataType | None = None) -> Value:
        """``value`` with its shape (and element type) recorded; returns it."""

    def scope(self, path: str) -> AbstractContextManager[None]:
        """Name what is written meanwhile after ``path``."""

