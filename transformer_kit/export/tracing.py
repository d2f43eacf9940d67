"""Tracing an export's graphs without its weights.

The graphs are traced from a copy of the model on PyTorch's ``meta`` device (:func:`skeleton`):
shapes and dtypes only, so tracing an 8B model costs what tracing a small one does, and no
weight is copied. :func:`trace_graph` returns the graph as an ``onnx_ir`` model whose weight
initializers carry no values, named by the model's state-dict names; the weight writer
(``weight_writer.py``) then streams each weight from its source into ``weights.data``.
The model's buffers (rotary frequencies, position tables) are small and computed when the
model is built: they keep their real values, so the optimizer folds what it folded before.
"""

from __future__ import annotations

import contextlib
import copy
import io
import logging
import re
import warnings
from typing import Any

import numpy as np
import onnx_ir as ir
import torch
from torch import Tensor, nn

from transformer_kit.checkpoints.streaming import drop_guards
from transformer_kit.errors import ExportError
from transformer_kit.export.graphs import GraphSpec, graph_specs
from transformer_kit.export.layer_replication import extend_layers
from transformer_kit.export.layer_stacks import TRACED_LAYERS, truncated

MAX_IR_VERSION = 13  # the newest ONNX IR onnxruntime 1.31 reads


@contextlib.contextmanager
def quiet_exporter():
    """The dynamo exporter prints progress and logs warnings for every graph; silence both."""
    loggers = [logging.getLogger(n) for n in ("torch.onnx", "torch.export", "torch._export",
                                              "onnxscript", "onnx_ir")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def skeleton(model: nn.Module, half: bool = False) -> tuple[nn.Module, dict[str, Tensor]]:
    """A copy of ``model`` on the ``meta`` device (in float16 when ``half``, else float32) and the model's
    buffers by name, with their values. Parameters are not copied (tied ones stay tied)."""
    memo: dict[int, Any] = {id(model.streamed_weights): None} if hasattr(model, "streamed_weights") else {}
    for param in model.parameters():
        memo[id(param)] = nn.Parameter(torch.empty_like(param, device="meta"), requires_grad=False)
    copied = copy.deepcopy(model, memo)
    drop_guards(copied)
    buffers = dict(copied.named_buffers(remove_duplicate=False))
    copied.to("meta")
    copied.half() if half else copied.float()  # a bfloat16 model exports in float32
    return copied.eval(), buffers


def _to_meta(value: Any) -> Any:
    if isinstance(value, Tensor):
        return value.to("meta")
    if isinstance(value, (list, tuple)):
        return type(value)(_to_meta(v) for v in value)
    return value


def first_line(exc: Exception) -> str:
    """The first line of an exception's message, without the exporter's colours."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).strip()  # the exporter colours its text
    return text.splitlines()[0] if text else type(exc).__name__


def trace_graph(name: str, spec: GraphSpec, opset: int, translations: dict,
                buffers: dict[str, Tensor], prefix: str) -> ir.Model:
    """Trace ``spec`` (a module of a :func:`skeleton`) into an ``onnx_ir`` model, optimized as
    ``torch.onnx.export`` optimizes, whose weights have no value. ``buffers``: real values by
    state-dict name; ``prefix``: what the graph's wrapper puts before those names."""
    with quiet_exporter():
        try:
            program = torch.onnx.export(
                spec.module, _to_meta(spec.args), dynamo=True, opset_version=opset,
                dynamic_shapes=spec.dynamic_shapes, input_names=spec.inputs,
                output_names=spec.outputs, custom_translation_table=translations or None,
                verbose=False, optimize=False,
            )
        except Exception as exc:
            raise ExportError(
                f"torch.onnx.export failed for graph {name!r}: {type(exc).__name__}: "
                f"{first_line(exc)}. If a component calls a custom op, its plugin can map the op "
                "to ONNX through the transformer_kit_onnx_translations hook."
            ) from exc
        model = program.model
        bind_buffers(model, buffers, prefix)
        tidy(model)
    model.ir_version = min(model.ir_version, MAX_IR_VERSION)
    return model


def bind_buffers(model: ir.Model, buffers: dict[str, Tensor], prefix: str) -> None:
    """Give the buffers' initializers their values; take the weights' (meta) values away."""
    for key, value in model.graph.initializers.items():
        state_name = key[len(prefix):] if key.startswith(prefix) else key
        raw = getattr(value.const_value, "raw", None)
        if state_name in buffers:  # real values: folded where torch's export folded them
            value.const_value = ir.Tensor(_numpy(buffers[state_name], value.dtype), name=key)
        elif isinstance(raw, Tensor) and raw.is_meta:
            value.const_value = None  # a weight: the writer streams it


def trace_stack_once(name: str, model: nn.Module, stack: str, opset: int, translations: dict,
                     buffers: dict[str, Tensor]) -> ir.Model | None:
    """Graph ``name`` of ``model`` (a :func:`skeleton`) traced with the first
    :data:`TRACED_LAYERS` layers of ``stack`` and extended to all of them; ``None`` when the
    traced graph does not repeat (trace it whole then)."""
    total = len(getattr(model, stack).layers)
    with truncated(model, stack, TRACED_LAYERS):
        spec = graph_specs(model)[name]
        prefix = "" if spec.module is model else "model."
        graph = trace_graph(name, spec, opset, translations, buffers, prefix)
    if not extend_layers(graph, stack, TRACED_LAYERS, total):
        return None
    bind_buffers(graph, buffers, prefix)
    return graph


def _numpy(tensor: Tensor, dtype: ir.DataType | None) -> np.ndarray:
    array = tensor.detach().cpu().numpy()
    return array.astype(dtype.numpy()) if dtype is not None else array


def tidy(model: ir.Model) -> None:
    """What ``torch.onnx.export(optimize=True)`` does: constant folding (never of a weight:
    they have no value here) and the ONNX fusions."""
    import onnxscript.optimizer
    import onnxscript.rewriter.onnx_fusions

    with quiet_exporter():  # it logs every weight it cannot deduplicate (they have no value here)
        onnxscript.optimizer.optimize_ir(model)
        onnxscript.rewriter.onnx_fusions.fuse(model)
