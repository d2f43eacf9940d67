"""Graphs traced in a forked process come back as traced (weights without values, constants
with theirs), a failure comes back as the same error, and a child that dies leaves the graph
to be traced here."""

from __future__ import annotations

import os
import time

import numpy as np
import onnx_ir as ir
import pytest

import transformer_kit as tk
from tests.combinations import tiny_config
from transformer_kit.errors import ExportError
from transformer_kit.export import export_onnx, exporter
from transformer_kit.export.traced_ahead import TracedAhead, can_trace_ahead

pytestmark = pytest.mark.skipif(not can_trace_ahead(), reason="graphs are traced ahead on Linux only")


def _graph() -> ir.Model:
    """x @ weight + bias: the weight has no value (streamed later), the bias has one."""
    x = ir.Value(name="x", shape=ir.Shape([2, 4]), type=ir.TensorType(ir.DataType.FLOAT))
    weight = ir.Value(name="layer.weight", shape=ir.Shape([4, 3]), type=ir.TensorType(ir.DataType.FLOAT),
                      const_value=ir.tensor(np.zeros((4, 3), np.float32)))
    bias = ir.Value(name="layer.bias", shape=ir.Shape([3]), type=ir.TensorType(ir.DataType.FLOAT),
                    const_value=ir.tensor(np.arange(3, dtype=np.float32)))
    product = ir.node("MatMul", [x, weight])
    total = ir.node("Add", [product.outputs[0], bias])
    graph = ir.Graph([x], total.outputs, nodes=[product, total], initializers=[weight, bias],
                     opset_imports={"": 23})
    weight.const_value = None
    return ir.Model(graph, ir_version=10)


def test_a_graph_traced_ahead_comes_back_as_traced(tmp_path):
    ahead = TracedAhead(lambda name: (_graph(), 3), ["step"], tmp_path)
    try:
        graph, layers = ahead.take("step", patience=60)
    finally:
        ahead.close()
    assert layers == 3
    assert graph.graph.initializers["layer.weight"].const_value is None
    np.testing.assert_array_equal(graph.graph.initializers["layer.bias"].const_value.numpy(), [0, 1, 2])
    assert [n.op_type for n in graph.graph] == ["MatMul", "Add"]
    assert list(tmp_path.iterdir()) == []  # its files are gone once taken


def test_a_failure_in_the_child_is_raised_here(tmp_path):
    def trace(name):
        raise ExportError(f"torch.onnx.export failed for graph {name!r}: no translation")

    ahead = TracedAhead(trace, ["step"], tmp_path)
    with pytest.raises(ExportError, match="failed for graph 'step': no translation"):
        ahead.take("step", patience=60)
    ahead.close()
    assert list(tmp_path.iterdir()) == []


def test_any_other_failure_says_what_it_was(tmp_path):
    ahead = TracedAhead(lambda name: 1 / 0, ["step"], tmp_path)
    with pytest.raises(ExportError, match="Export failed: ZeroDivisionError: division by zero"):
        ahead.take("step", patience=60)
    ahead.close()


def test_a_child_that_dies_leaves_the_graph_to_be_traced_here(tmp_path):
    ahead = TracedAhead(lambda name: os._exit(3), ["step"], tmp_path)
    assert ahead.take("step", patience=60) is None
    ahead.close()
    assert list(tmp_path.iterdir()) == []


def test_a_child_still_at_work_after_the_patience_is_stopped(tmp_path):
    ahead = TracedAhead(lambda name: time.sleep(600), ["step"], tmp_path)
    started = time.monotonic()
    assert ahead.take("step", patience=0.5) is None
    assert time.monotonic() - started < 30
    with pytest.raises(ChildProcessError):
        os.waitpid(ahead.pid, os.WNOHANG)  # stopped and reaped
    ahead.close()


def test_an_export_that_cannot_fork_traces_every_graph_here(tmp_path, monkeypatch):
    def no_fork():
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(os, "fork", no_fork)
    monkeypatch.setattr(exporter, "TRACE_AHEAD_MIN_PARAMETERS", 0)  # a tiny model forks too
    model = tk.build_model(tiny_config("decoder")).eval()
    report = export_onnx(model, tmp_path / "onnx")
    assert report.max_error < report.tolerance and report.tokens_match


def test_an_export_takes_its_step_graph_from_the_child_and_verifies(tmp_path, monkeypatch):
    monkeypatch.setattr(exporter, "TRACE_AHEAD_MIN_PARAMETERS", 0)
    taken = []
    take = TracedAhead.take
    monkeypatch.setattr(TracedAhead, "take", lambda self, name, patience: taken.append(
        take(self, name, patience)) or taken[-1])
    model = tk.build_model(tiny_config("decoder")).eval()
    report = export_onnx(model, tmp_path / "onnx")
    assert len(taken) == 1 and taken[0] is not None  # decoder_step, traced in the child
    assert report.max_error < report.tolerance and report.tokens_match
    assert sorted(p.name for p in (tmp_path / "onnx").iterdir() if p.name.startswith(".")) == []
