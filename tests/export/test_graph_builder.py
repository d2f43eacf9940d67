"""The graphs are built from the components' lowerings, and a person can read them: every node
is named by the module path that wrote it (``decoder.layers.1.self_attention.o_proj/MatMul``),
names are unique, and a component's own lowering (a plugin's too) writes its nodes."""

from __future__ import annotations

import onnx
import pytest
import torch

import transformer_kit as tk
from tests.combinations import tiny_config
from transformer_kit.export import export_onnx

#: Graph-level scopes besides the model's module paths: the graph inputs, the masks (not modules),
#: constants and the step graph's head (the stacks' attention inputs are under the stack's path).
_EXTRA_SCOPES = ("constants", "mask", "head", "input_ids", "attention_mask", "logit_positions")


def _nodes(path) -> list[onnx.NodeProto]:
    return list(onnx.load(str(path), load_external_data=False).graph.node)


@pytest.fixture(scope="module")
def decoder_export(tmp_path_factory):
    torch.manual_seed(0)
    model = tk.build_model(tiny_config("decoder", attention="sdpa", positional="rotary", block="pre_norm",
                                       feedforward="swiglu", norm="rmsnorm", pad_id=0)).eval()
    folder = tmp_path_factory.mktemp("onnx")
    return model, folder, export_onnx(model, folder)


@pytest.mark.parametrize("graph", ["model", "decoder_step"])
def test_every_node_is_named_by_the_module_that_wrote_it(decoder_export, graph):
    model, folder, _ = decoder_export
    paths = {name for name, _ in model.named_modules() if name}
    nodes = _nodes(folder / f"{graph}.onnx")
    names = [n.name for n in nodes]
    assert len(set(names)) == len(names)
    for node in nodes:
        path, _, op = node.name.partition("/")
        scope = path.split(".attention_inputs")[0].split(".{")[0]
        assert scope in paths or scope in _EXTRA_SCOPES, node.name
        assert op.split("_")[0] == node.op_type, node.name
    assert "decoder.layers.1.self_attention.o_proj/MatMul" in names
    assert "decoder.layers.0.self_attention/Attention" in names
    assert "decoder.layers.0.feedforward.{gate,up}/MatMul" in names
    assert any(n.startswith("decoder.layers.0.ff_norm/SkipSimplifiedLayerNormalization") for n in names)


def test_the_step_graph_reads_each_layer_s_cache_and_writes_it_back(decoder_export):
    _, folder, report = decoder_export
    attention = [n for n in _nodes(folder / "decoder_step.onnx") if n.op_type == "Attention"]
    assert [list(n.input)[4:6] for n in attention] == [
        [f"past_key_values.{i}.key", f"past_key_values.{i}.value"] for i in range(2)]
    assert [list(n.output)[1:3] for n in attention] == [
        [f"present.{i}.key", f"present.{i}.value"] for i in range(2)]
    assert report.max_error < 1e-5 and report.tokens_match and report.traced_components == {}


def test_a_plugin_lowering_writes_its_component(fresh_registry, tmp_path):
    """A norm registered by a plugin with its own lowering: the export writes its nodes (named
    under the norm's path), traces nothing, and matches PyTorch."""
    from transformer_kit.plugins.norms import rms_norm

    def scaled_rms_norm(g, norm, x):  # RMSNorm written the long way: the lowering is the plugin's
        mean = g.op.ReduceMean(g.op.Mul(x, x), [-1], keepdims=1)
        normed = g.op.Div(x, g.op.Sqrt(g.op.Add(mean, g.constant(norm.eps))))
        return g.op.Mul(normed, g.weight(norm, "weight"))

    class Plugin:
        @tk.hookimpl
        def transformer_kit_components(self):
            return [tk.Component("norm", "long_rmsnorm", rms_norm)]

        @tk.hookimpl
        def transformer_kit_lowerings(self):
            return [tk.Lowering("norm", "long_rmsnorm", forward=scaled_rms_norm)]

    tk.register_plugin(Plugin(), "long_rmsnorm")
    torch.manual_seed(0)
    model = tk.build_model(tiny_config("decoder", norm="long_rmsnorm", block="pre_norm")).eval()
    report = export_onnx(model, tmp_path / "onnx")
    assert report.max_error < 1e-5 and report.tokens_match and report.traced_components == {}
    names = [n.name for n in _nodes(tmp_path / "onnx" / "model.onnx")]
    assert "decoder.layers.0.self_norm/ReduceMean" in names
    assert not any(n.endswith("/RMSNormalization") for n in names)
