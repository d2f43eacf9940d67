"""A component that brings no lowering is traced alone and inlined: once per distinct
configuration (not per layer or graph), under its own path, verified like the rest; the report
names it and why; a trace that fails names the component and what to do."""

from __future__ import annotations

import onnx
import pytest
import torch
from torch import nn

import transformer_kit as tk
from tests.combinations import tiny_config
from transformer_kit.export import export_onnx
from transformer_kit.plugins.positional import RotaryPositions, rotary_onnx


class SquaredReLU(nn.Module):
    """Primer's feed-forward: linear2(relu(linear1(x))^2); a plugin's, with no lowering."""

    def __init__(self, d_model: int, d_ff: int, power: float = 2.0) -> None:
        super().__init__()
        self.linear1, self.linear2, self.power = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model), power

    def forward(self, x):
        return self.linear2(torch.relu(self.linear1(x)) ** self.power)


class HalfTurnRotary(RotaryPositions):
    """A rotary encoding that also adds a learned bias to the embeddings: its plugin lowers the
    rotation but not ``embed``."""

    def __init__(self, head_dim: int, d_model: int) -> None:
        super().__init__(head_dim)
        self.shift = nn.Parameter(torch.randn(d_model) * 0.1)

    def embed(self, x, positions):
        return x + self.shift


class NeedsValues(nn.Module):
    """A norm whose forward reads a tensor's value, which tracing on the meta device cannot."""

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x):
        return x * self.weight if float(x.abs().max()) > 0 else x


class Plugin:
    @tk.hookimpl
    def transformer_kit_components(self):
        return [tk.Component("feedforward", "squared_relu", SquaredReLU),
                tk.Component("positional", "shifted_rotary", HalfTurnRotary),
                tk.Component("norm", "needs_values", NeedsValues)]

    @tk.hookimpl
    def transformer_kit_lowerings(self):
        return [tk.Lowering("positional", "shifted_rotary", rotate=rotary_onnx)]


@pytest.fixture
def plugin(fresh_registry):
    tk.register_plugin(Plugin(), "traced_plugin")


def test_a_component_is_traced_once_for_every_layer_and_graph(plugin, tmp_path):
    torch.manual_seed(0)
    model = tk.build_model(tiny_config("decoder", num_layers=4, feedforward="squared_relu")).eval()
    report = export_onnx(model, tmp_path / "onnx")
    assert report.max_error < 1e-5 and report.tokens_match
    assert list(report.traced_components) == ["feedforward 'squared_relu' (plugin 'traced_plugin')"]
    assert report.traced_components["feedforward 'squared_relu' (plugin 'traced_plugin')"].startswith(
        "no lowering registered; traced 1 time (")
    names = [n.name for n in onnx.load(str(tmp_path / "onnx" / "decoder_step.onnx")).graph.node]
    for i in range(4):  # inlined in every layer, named under the layer's feed-forward
        assert any(n.startswith(f"decoder.layers.{i}.feedforward/") for n in names)


def test_each_distinct_configuration_is_traced_once(plugin, tmp_path):
    torch.manual_seed(0)
    model = tk.build_model(tiny_config(
        "decoder", num_layers=4, feedforward="squared_relu", layer_types=["a", "b", "a", "b"],
        layer_variants={"a": {}, "b": {"feedforward": {"name": "squared_relu", "power": 3.0}}})).eval()
    report = export_onnx(model, tmp_path / "onnx")
    assert report.max_error < 1e-5 and report.tokens_match
    (why,) = report.traced_components.values()
    assert why.startswith("no lowering registered; traced 2 times (")


def test_a_point_the_lowering_leaves_out_is_traced(plugin, tmp_path):
    torch.manual_seed(0)
    model = tk.build_model(tiny_config("encoder_decoder", positional="shifted_rotary")).eval()
    report = export_onnx(model, tmp_path / "onnx")
    assert report.max_error < 1e-5 and report.tokens_match
    assert list(report.traced_components) == ["positional 'shifted_rotary' (plugin 'traced_plugin')"]
    assert report.traced_components["positional 'shifted_rotary' (plugin 'traced_plugin')"].startswith(
        "its lowering writes no embed; traced 1 time")  # one trace for the source and target sides


def test_a_trace_that_fails_names_the_component_and_what_to_do(plugin, tmp_path):
    model = tk.build_model(tiny_config("decoder", norm="needs_values")).eval()
    with pytest.raises(tk.ExportError, match=r"norm 'needs_values' \(plugin 'traced_plugin'\) has no "
                                             r"lowering, and tracing its forward alone failed: .*"
                                             r"Give it a lowering \(tk.Lowering"):
        export_onnx(model, tmp_path / "onnx")
    assert not (tmp_path / "onnx").exists()
