"""A gated feed-forward (``swiglu``, ``geglu``) exports its gate and up projections as one product
over the concatenated weights in a generating model's graphs: the same outputs as PyTorch, and in
int4 the same logits to the bit as two products, since 4-bit blocks run along the input
dimension of each output column. Encoders keep two products. A third-party component that
declares the ``gate_up`` lowering but brings no lowering of its own gets the packed product and
its ``gated`` traced; one without the contract is traced whole."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

import transformer_kit as tk
from tests.combinations import tiny_config
from transformer_kit.export import export_onnx
from transformer_kit.plugins.feedforward import SwiGLU
from transformer_kit.runtime import OnnxModel


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


def _two_products(g, ff, x):
    """SwiGLU's lowering with gate and up as two products (a plugin's own lowering)."""
    gate, up = g.linear(ff.gate, x), g.linear(ff.up, x)
    return g.linear(ff.down, g.op.Mul(g.op.Mul(gate, g.op.Sigmoid(gate)), up))


class TwoProducts:
    @tk.hookimpl
    def transformer_kit_components(self):
        return [tk.Component("feedforward", "swiglu_two", SwiGLU)]

    @tk.hookimpl
    def transformer_kit_lowerings(self):
        return [tk.Lowering("feedforward", "swiglu_two", forward=_two_products)]


def test_int4_logits_are_those_of_two_products_to_the_bit(swiglu_decoder, tmp_path, fresh_registry):
    export_onnx(swiglu_decoder, tmp_path / "packed", quantize="int4")
    assert _weight_widths(tmp_path / "packed" / "decoder_step.onnx", "MatMulNBits").count(
        2 * swiglu_decoder.config.d_ff) == 2
    tk.register_plugin(TwoProducts(), "two_products")
    two = tk.build_model({**swiglu_decoder.config.to_dict(), "feedforward": "swiglu_two"}).eval()
    two.load_state_dict(swiglu_decoder.state_dict())
    report = export_onnx(two, tmp_path / "two", quantize="int4")
    assert report.traced_components == {}  # its own lowering wrote it
    assert swiglu_decoder.config.d_ff in _weight_widths(tmp_path / "two" / "decoder_step.onnx",
                                                        "MatMulNBits")
    ids = np.array([[3, 4, 5, 6, 7, 8], [0, 0, 9, 10, 11, 12]])
    packed, two = OnnxModel(tmp_path / "packed", "cpu"), OnnxModel(tmp_path / "two", "cpu")
    assert np.array_equal(packed(ids), two(ids))
    assert np.array_equal(packed.generate(ids, 6), two.generate(ids, 6))


def test_encoders_keep_two_products(tmp_path):
    torch.manual_seed(0)
    encoder = tk.build_model(tiny_config("encoder", feedforward="swiglu")).eval()
    assert export_onnx(encoder, tmp_path / "onnx").max_error < 1e-5
    widths = _weight_widths(tmp_path / "onnx" / "model.onnx", "MatMul")
    assert encoder.config.d_ff in widths and 2 * encoder.config.d_ff not in widths


class DeclaredGated(SwiGLU):
    """A plugin's gated unit (tanh-gated) that declares the ``gate_up`` contract, no lowering."""

    def gated(self, gate, up):
        return self.down(torch.tanh(gate) * up)


def test_a_component_declaring_gate_up_gets_one_product_and_its_gated_traced(fresh_registry, tmp_path):
    class Plugin:
        @tk.hookimpl
        def transformer_kit_components(self):
            return [tk.Component("feedforward", "tanh_glu", DeclaredGated, lowerings={"gate_up"})]

    tk.register_plugin(Plugin(), "tanh_glu")
    torch.manual_seed(0)
    model = tk.build_model(tiny_config("decoder", d_ff=24, feedforward="tanh_glu")).eval()
    report = export_onnx(model, tmp_path / "onnx")
    assert report.max_error < 1e-5 and report.tokens_match
    assert _weight_widths(tmp_path / "onnx" / "decoder_step.onnx", "MatMul").count(48) == 2
    (why,) = report.traced_components.values()
    assert why.startswith("no lowering registered; traced 1 time")  # gated, once for both layers


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
    report = export_onnx(model, tmp_path / "onnx")
    assert report.max_error < 1e-5 and report.tokens_match
    assert model.config.d_ff in _weight_widths(tmp_path / "onnx" / "decoder_step.onnx", "MatMul")
    assert list(report.traced_components) == [
        "feedforward 'tanh_gated' (plugin 'tanh_gated')"]
