"""A feed-forward component that declares the ``gate_up`` lowering (``swiglu``) exports its gate
and up projections as one product over the concatenated weights in a generating model's graphs:
the same outputs as PyTorch, and in int4 the same logits to the bit as two products, since
4-bit blocks run along the input dimension of each output column. Encoders and components
without the contract keep two products; the rewrite exists only while the export traces."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

import transformer_kit as tk
import transformer_kit.export.exporter as exporter
from tests.combinations import tiny_config
from transformer_kit.export import OnnxModel, export_onnx
from transformer_kit.export.packed_feedforward import packed_feedforward_patch
from transformer_kit.export.patching import packed_parameters
from transformer_kit.plugins.feedforward import SwiGLU


def _weight_widths(path, op: str) -> list[int]:
    """The output width of every ``op`` node's constant weight (MatMul: columns; MatMulNBits: N)."""
    model = onnx.load(str(path))
    shapes = {i.name: list(i.dims) for i in model.graph.initializer}
    widths = []
    for node in model.graph.node:
        if node.op_type == op == "MatMulNBits":
            widths.append(next(a.i for a in node.attribute if a.name == "N"))
        elif node.op_type == op and node.input[1] in shapes:
            widths.append(shapes[node.input[1]][-1])
    return widths


@pytest.fixture(scope="module")
def swiglu_decoder():
    torch.manual_seed(0)
    return tk.build_model(tiny_config("decoder", d_model=32, d_ff=64, feedforward="swiglu",
                                      norm="rmsnorm", positional="rotary", block="pre_norm",
                                      pad_id=0)).eval()


@torch.no_grad()
def test_gate_and_up_are_one_product_and_match_pytorch(swiglu_decoder, tmp_path):
    report = export_onnx(swiglu_decoder, tmp_path / "onnx")
    assert report.max_error < 1e-5 and report.tokens_match
    d_ff = swiglu_decoder.config.d_ff
    for graph in ("model", "decoder_step"):
        widths = _weight_widths(tmp_path / "onnx" / f"{graph}.onnx", "MatMul")
        assert widths.count(2 * d_ff) == 2 and d_ff not in widths, (graph, widths)
    om = OnnxModel(tmp_path / "onnx", "cpu")
    ids = torch.tensor([[0, 0, 5, 6, 7], [3, 4, 5, 6, 7]])
    np.testing.assert_allclose(om(ids.numpy()), swiglu_decoder(ids).numpy(), rtol=1e-5, atol=1e-5)


def test_int4_logits_are_those_of_two_products_to_the_bit(swiglu_decoder, tmp_path, monkeypatch):
    export_onnx(swiglu_decoder, tmp_path / "packed", quantize="int4")
    assert _weight_widths(tmp_path / "packed" / "decoder_step.onnx", "MatMulNBits").count(
        2 * swiglu_decoder.config.d_ff) == 2
    monkeypatch.setattr(exporter, "packed_feedforward_patch",
                        lambda model: packed_feedforward_patch(model, enabled=False))
    export_onnx(swiglu_decoder, tmp_path / "two", quantize="int4")
    assert swiglu_decoder.config.d_ff in _weight_widths(tmp_path / "two" / "decoder_step.onnx",
                                                        "MatMulNBits")
    ids = np.array([[3, 4, 5, 6, 7, 8], [0, 0, 9, 10, 11, 12]])
    packed, two = OnnxModel(tmp_path / "packed", "cpu"), OnnxModel(tmp_path / "two", "cpu")
    assert np.array_equal(packed(ids), two(ids))
    assert np.array_equal(packed.generate(ids, 6), two.generate(ids, 6))


def test_encoders_keep_two_products(tmp_path):
    torch.manual_seed(0)
    encoder = tk.build_model(tiny_config("encoder", feedforward="swiglu")).eval()
    with packed_feedforward_patch(encoder) as patched:
        assert patched == 0


def test_the_patch_exists_only_inside_the_export(swiglu_decoder):
    layers = [m for m in swiglu_decoder.modules() if isinstance(m, SwiGLU)]
    ids = torch.tensor([[3, 4, 5, 6]])
    with torch.no_grad():
        before = swiglu_decoder(ids)
        with packed_feedforward_patch(swiglu_decoder) as patched:
            assert patched == len(layers) == 2
            assert all(packed_parameters(m, "packed_gate_up")[0].shape
                       == (2 * m.gate.out_features, m.gate.in_features) for m in layers)
            assert torch.allclose(swiglu_decoder(ids), before, atol=1e-6)
    assert all("forward" not in m.__dict__ and packed_parameters(m, "packed_gate_up") == (None, None)
               for m in layers)
    with pytest.raises(RuntimeError, match="inside"), packed_feedforward_patch(swiglu_decoder):
        raise RuntimeError("inside")
    assert all("forward" not in m.__dict__ for m in layers)  # undone after an error too


class GatedWithoutContract(torch.nn.Module):
    """Has gate and up but no ``gated``: the lowering's contract is not met, so no packing."""

    def __init__(self, d_model: int, d_ff: int, dropout: float) -> None:
        super().__init__()
        self.gate, self.up = torch.nn.Linear(d_model, d_ff), torch.nn.Linear(d_model, d_ff)
        self.down = torch.nn.Linear(d_ff, d_model)

    def forward(self, x):
        return self.down(torch.tanh(self.gate(x)) * self.up(x))


def test_a_component_without_the_contract_keeps_its_forward(fresh_registry, tmp_path):
    component = tk.Component("feedforward", "tanh_gated", GatedWithoutContract, lowerings={"gate_up"})

    class Plugin:
        @tk.hookimpl
        def transformer_kit_components(self):
            return [component]

    tk.register_plugin(Plugin(), "tanh_gated")
    torch.manual_seed(0)
    model = tk.build_model(tiny_config("decoder", feedforward="tanh_gated")).eval()
    with packed_feedforward_patch(model) as patched:
        assert patched == 0
    assert export_onnx(model, tmp_path / "onnx").max_error < 1e-5
