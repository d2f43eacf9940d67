"""Self-attention whose kernel declares the ``attention`` lowering (``sdpa``) exports as one ONNX
Attention op per layer on packed heads, the cache concatenated inside it, and rotary positions
(the ``rotary`` lowering) as RotaryEmbedding ops; other kernels, ALiBi and opsets below 23 keep
the general graph. Both must match eager PyTorch, and the export leaves the model as it was:
the eager model has one forward path."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import pytest
import torch

import transformer_kit as tk
from tests.combinations import tiny_config
from transformer_kit.core.attention import MultiHeadAttention
from transformer_kit.export import export_onnx
from transformer_kit.plugins.attention import SdpaAttention
from transformer_kit.runtime import OnnxModel


def _ops(path) -> collections.Counter:
    return collections.Counter(n.op_type for n in onnx.load(str(path)).graph.node)


def _attention_nodes(path) -> list:
    return [n for n in onnx.load(str(path)).graph.node if n.op_type == "Attention"]


@pytest.fixture(scope="module")
def gqa_decoder():
    torch.manual_seed(0)
    return tk.build_model(tiny_config("decoder", attention="sdpa", positional="learned",
                                      num_kv_heads=2, pad_id=0)).eval()


def test_step_graph_holds_one_attention_op_per_layer_with_the_cache_inside(gqa_decoder, tmp_path):
    export_onnx(gqa_decoder, tmp_path / "onnx")
    step = tmp_path / "onnx" / "decoder_step.onnx"
    nodes = _attention_nodes(step)
    assert len(nodes) == 2
    for i, node in enumerate(nodes):
        attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert attributes["q_num_heads"] == 4 and attributes["kv_num_heads"] == 2
        assert list(node.input)[4:6] == [f"past_key_values.{i}.key", f"past_key_values.{i}.value"]
        assert list(node.output)[1:3] == [f"present.{i}.key", f"present.{i}.value"]
    ops = _ops(step)
    assert ops["Transpose"] <= 3 and ops["Expand"] <= 1  # no per-layer head split or KV repeat


@torch.no_grad()
def test_packed_export_matches_pytorch_with_padding_and_grouped_heads(gqa_decoder, tmp_path):
    report = export_onnx(gqa_decoder, tmp_path / "onnx")
    assert report.max_error < 1e-5
    om = OnnxModel(tmp_path / "onnx", "cpu")
    ids = torch.tensor([[0, 0, 5, 6, 7], [3, 4, 5, 6, 7], [9, 8, 0, 0, 0]])
    expected = gqa_decoder(ids)
    got = om(ids.numpy())
    real = (ids != 0).numpy()
    np.testing.assert_allclose(got[real], expected.numpy()[real], rtol=1e-5, atol=1e-5)
    assert np.array_equal(om.generate(ids.numpy(), 6), gqa_decoder.generate(ids, 6).numpy())


@pytest.mark.parametrize(("overrides", "opset"), [
    ({"attention": "matmul"}, 23),
    ({"attention": "sdpa", "positional": "alibi"}, 23),
    ({"attention": "sdpa"}, 22),
])
def test_other_kernels_encodings_and_opsets_keep_the_general_graph(overrides, opset, tmp_path):
    torch.manual_seed(0)
    model = tk.build_model(tiny_config("decoder", pad_id=0, **overrides)).eval()
    report = export_onnx(model, tmp_path / "onnx", opset=opset)
    assert report.max_error < 1e-4
    for node in _attention_nodes(tmp_path / "onnx" / "decoder_step.onnx"):
        assert "q_num_heads" not in {a.name for a in node.attribute}
        assert len([i for i in node.input if i]) <= 4  # no past inputs


@pytest.mark.parametrize("rotary", [{"name": "rotary"}, {"name": "rotary", "rotary_dim": 2, "base": 500.0}])
def test_rotary_positions_pack_into_rotary_embedding_ops(rotary, tmp_path):
    """Rotary declares the "rotary" lowering: q and k turn in one RotaryEmbedding op each, on
    packed heads (a partial rotary_dim too), and the layer keeps one Attention op."""
    torch.manual_seed(0)
    model = tk.build_model(tiny_config("decoder", attention="sdpa", positional=rotary, pad_id=0)).eval()
    report = export_onnx(model, tmp_path / "onnx")
    assert report.max_error < 1e-5 and report.tokens_match
    ops = _ops(tmp_path / "onnx" / "decoder_step.onnx")
    assert ops["RotaryEmbedding"] == 4 and ops["Neg"] == 0  # two per layer, no hand-made turn
    assert all("q_num_heads" in {a.name for a in n.attribute}
               for n in _attention_nodes(tmp_path / "onnx" / "decoder_step.onnx"))
    ids = torch.tensor([[0, 0, 5, 6, 7], [3, 4, 5, 6, 7]])
    om = OnnxModel(tmp_path / "onnx", "cpu")
    with torch.no_grad():
        expected = model(ids).numpy()
    real = (ids != 0).numpy()
    np.testing.assert_allclose(om(ids.numpy())[real], expected[real], rtol=1e-5, atol=1e-5)
    assert np.array_equal(om.generate(ids.numpy(), 6), model.generate(ids, 6).numpy())


def test_a_rotary_without_the_lowering_keeps_its_own_turn(fresh_registry, tmp_path):
    from transformer_kit.plugins.positional import RotaryPositions

    tk.register_plugin(_plugin(tk.Component("positional", "plain_rotary", RotaryPositions), "plain_rotary"))
    torch.manual_seed(0)
    model = tk.build_model(tiny_config("decoder", attention="sdpa", positional="plain_rotary", pad_id=0))
    report = export_onnx(model, tmp_path / "onnx")
    assert report.max_error < 1e-5
    ops = _ops(tmp_path / "onnx" / "decoder_step.onnx")
    assert ops["RotaryEmbedding"] == 0 and ops["Neg"] >= 4


def _plugin(component: tk.Component, name: str):
    import types

    module = types.ModuleType(name)
    module.transformer_kit_components = tk.hookimpl(lambda: [component])
    return module


def test_a_kernel_opts_in_through_its_component_not_its_class(fresh_registry, tmp_path):
    """The same kernel class, registered without and with the declared lowering."""
    tk.register_plugin(_plugin(tk.Component("attention", "plain_sdpa", SdpaAttention,
                                            provides={"score_bias"}), "plain"))
    tk.register_plugin(_plugin(tk.Component("attention", "fused_sdpa", SdpaAttention,
                                            provides={"score_bias"}, lowerings={"attention"}), "fused"))
    for name, packed in (("plain_sdpa", False), ("fused_sdpa", True)):
        torch.manual_seed(0)
        model = tk.build_model(tiny_config("decoder", attention=name, positional="learned", pad_id=0))
        report = export_onnx(model, tmp_path / name)
        assert report.max_error < 1e-5 and report.tokens_match
        nodes = _attention_nodes(tmp_path / name / "decoder_step.onnx")
        assert bool(nodes) and all(("q_num_heads" in {a.name for a in n.attribute}) == packed for n in nodes)


def test_an_unknown_lowering_is_refused():
    with pytest.raises(ValueError, match=r"lowerings \['flash'\] are not known for kind 'attention'"):
        tk.Component("attention", "x", SdpaAttention, lowerings={"flash"})
    with pytest.raises(ValueError, match=r"not known for kind 'norm'"):
        tk.Component("norm", "x", torch.nn.LayerNorm, lowerings={"attention"})


def test_the_export_leaves_the_model_as_it_was(gqa_decoder, tmp_path):
    layers = [m for m in gqa_decoder.modules() if isinstance(m, MultiHeadAttention)]
    ids = torch.tensor([[3, 4, 5, 6]])
    with torch.no_grad():
        before = gqa_decoder(ids)
    attributes = [set(m.__dict__) for m in layers]
    export_onnx(gqa_decoder, tmp_path / "onnx")
    assert [set(m.__dict__) for m in layers] == attributes
    with torch.no_grad():
        assert torch.equal(gqa_decoder(ids), before)


def test_the_core_attention_module_has_one_forward_path():
    import inspect

    import transformer_kit.core.attention as attention

    source = inspect.getsource(attention)
    assert "tracing" not in source and "packed" not in source and "torch.ops" not in source
