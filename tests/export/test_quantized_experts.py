"""Quantized exports of a mixture of experts (``export/quantized_experts.py``): each sparse layer
becomes one onnxruntime ``QMoE`` node over experts in 4- or 8-bit blocks, and that node, run alone
in onnxruntime, equals the kit's PyTorch mixture of experts whose experts hold the values its
blocks stand for (read back from the export and dequantized here); the blocks stand for the
float experts within a quantization step; a router without renormalisation mixes by the
softmax over every expert."""

from __future__ import annotations

import copy

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import transformers as hf
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize
from onnx import helper, numpy_helper

import transformer_kit as tk
from tests.plugins.families import parity
from transformer_kit.checkpoints.gguf.blocks import GgufBlocks
from transformer_kit.export import Int4, export_onnx
from transformer_kit.export.quantized_experts import ExpertBits, expert_bits
from transformer_kit.plugins.mixture_of_experts import MixtureOfExperts

HIDDEN, INNER, EXPERTS, TOP_K = 32, 48, 8, 3

#: export option -> (QMoE's bits, its block, the largest relative error of the node against the
#: dequantized experts: float32 activations give float rounding; int8 activations (accuracy
#: level 4, and every blocked 8-bit QMoE) a few percent)
CASES = {
    "int4-level1": (Int4(block_size=16, accuracy_level=1, eight_bit=()), 4, 16, 1e-4),
    "int4-asymmetric-level1": (Int4(block_size=32, accuracy_level=1, symmetric=False, eight_bit=()),
                               4, 16, 1e-4),
    "int4-level4": (Int4(block_size=16, eight_bit=()), 4, 16, 3e-2),
    "int8": ("int8", 8, 16, 3e-2),
}


@pytest.fixture(scope="module", params=[True, False], ids=["renormalised", "softmax-over-all"])
def moe_model(request, tmp_path_factory):
    torch.manual_seed(0)
    reference = hf.Qwen3MoeForCausalLM(hf.Qwen3MoeConfig(
        vocab_size=parity.VOCAB, hidden_size=HIDDEN, intermediate_size=64, moe_intermediate_size=INNER,
        num_experts=EXPERTS, num_experts_per_tok=TOP_K, norm_topk_prob=request.param,
        num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2, head_dim=8,
        max_position_embeddings=64, bos_token_id=1, eos_token_id=2))
    folder = tmp_path_factory.mktemp("qwen3-moe")
    parity.random_norms(reference).save_pretrained(folder)
    return tk.from_hf(folder, pad_id=0)


def _nodes_alone(folder, op_type: str, hidden: int = HIDDEN,
                 experts: int = EXPERTS) -> list[tuple[onnx.ModelProto, onnx.NodeProto]]:
    """Each ``op_type`` node of the export's first graph as a model of its own (with the
    Softmax that gives it router_weights), its initializers' values loaded."""
    path = sorted(folder.glob("*.onnx"))[0]
    graph = onnx.load(path).graph
    values = {t.name: t for t in graph.initializer}
    producers = {out: n for n in graph.node for out in n.output}
    alone = []
    for node in (n for n in graph.node if n.op_type == op_type):
        nodes = [producers[name] for name in node.input if name in producers
                 and producers[name].op_type == "Softmax"] + [node]
        inits = [values[name] for n in nodes for name in n.input if name in values]
        x, logits = node.input[0], node.input[1]
        model = helper.make_model(helper.make_graph(
            nodes, "alone",
            [helper.make_tensor_value_info(x, onnx.TensorProto.FLOAT, ["tokens", hidden]),
             helper.make_tensor_value_info(logits, onnx.TensorProto.FLOAT, ["tokens", experts])],
            [helper.make_tensor_value_info(node.output[0], onnx.TensorProto.FLOAT, None)], inits),
            opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)],
            ir_version=10)
        alone.append((model, node))
    return alone


def _dequantized(arrays: dict, node: onnx.NodeProto, fc: int) -> torch.Tensor:
    """fc1 (fc=0) or fc2 (fc=1) of ``node`` as float (E, N, K): packed codes, low nibble first,
    (code - zero point) * scale per block."""
    packed, scales = arrays[node.input[2 + 3 * fc]], arrays[node.input[3 + 3 * fc]]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    bits, block = attrs["expert_weight_bits"], attrs.get("block_size", 0)
    codes = packed if bits == 8 else np.stack([packed & 15, packed >> 4], axis=-1).reshape(
        *packed.shape[:2], -1)
    e, n, k = codes.shape
    blocks = k // block if block else 1
    zp_input = 11 + fc
    if len(node.input) > zp_input and node.input[zp_input]:
        zp = arrays[node.input[zp_input]]
        zero = np.stack([zp & 15, zp >> 4], axis=-1).reshape(e, n, -1)[..., :blocks, None]
    else:
        zero = np.full((e, n, blocks, 1), 2 ** (bits - 1))
    values = (codes.reshape(e, n, blocks, -1).astype(np.float32) - zero) * scales.reshape(e, n, blocks, 1)
    return torch.from_numpy(values.reshape(e, n, k).astype(np.float32))


@pytest.mark.parametrize("case", list(CASES))
def test_each_qmoe_node_equals_the_moe_of_its_dequantized_experts(moe_model, case, tmp_path):
    quantize, bits, block, tolerance = CASES[case]
    export_onnx(moe_model, tmp_path, quantize=quantize, verify=False)
    layers = [m for m in moe_model.modules() if isinstance(m, MixtureOfExperts)]
    alone = _nodes_alone(tmp_path, "QMoE")
    assert len(alone) == len(layers) == 2
    for (model, node), layer in zip(alone, layers, strict=True):
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        assert (attrs["expert_weight_bits"], attrs.get("block_size")) == (bits, block)
        check_node_alone(model, node, layer, tolerance)


def check_node_alone(model: onnx.ModelProto, node: onnx.NodeProto, layer: MixtureOfExperts,
                     tolerance: float) -> None:
    """The QMoE ``node`` (alone in ``model``) equals ``layer`` with the experts its blocks stand
    for, within ``tolerance`` relative; those stand for the layer's own within a step."""
    arrays = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    bits = {a.name: helper.get_attribute_value(a) for a in node.attribute}["expert_weight_bits"]
    fc1, fc2 = _dequantized(arrays, node, 0), _dequantized(arrays, node, 1)
    dequantized = copy.deepcopy(layer)
    inner, hidden = dequantized.experts[0].gate.weight.shape
    for e, expert in enumerate(dequantized.experts):
        original = torch.stack([expert.gate.weight, expert.up.weight], dim=1).reshape(2 * inner, hidden)
        step = (original.abs().amax() / (4 if bits == 4 else 64)).item()  # a misplaced row: ~amax
        assert (fc1[e] - original).abs().max().item() <= step, "fc1 rows: gate, up interleaved"
        assert (fc2[e] - expert.down.weight).abs().max().item() <= step
        with torch.no_grad():
            expert.gate.weight.copy_(fc1[e, 0::2])
            expert.up.weight.copy_(fc1[e, 1::2])
            expert.down.weight.copy_(fc2[e])
    x = torch.randn(11, hidden, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = dequantized(x[None])[0].numpy()
        logits = layer.router(x)
        if layer.routing == "sigmoid":  # the node reads log(sigmoid(logits))
            logits = torch.nn.functional.logsigmoid(logits)
        logits = logits.numpy()
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = session.run(None, {node.input[0]: x.numpy(), node.input[1]: logits})[0]
    error = np.abs(got - expected).max() / np.abs(expected).max()
    assert error < tolerance, error


def test_the_routers_without_renormalisation_mix_by_a_softmax_over_every_expert(moe_model, tmp_path):
    export_onnx(moe_model, tmp_path, quantize="int8", verify=False)
    for model, node in _nodes_alone(tmp_path, "QMoE"):
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        softmax = [n for n in model.graph.node if n.op_type == "Softmax"]
        renormalised = moe_model.config.feedforward.params["normalize"]
        assert attrs["normalize_routing_weights"] == int(renormalised)
        assert (len(softmax) == 0) == renormalised
        if not renormalised:
            assert node.input[14] == softmax[0].output[0] and softmax[0].input[0] == node.input[1]


def test_int4_experts_stay_float_where_no_block_divides_their_widths():
    spec = expert_bits(Int4())
    assert spec == ExpertBits(4, 32, "search", True, 4, True)
    assert spec.block_for((32, 48), 4) == 16 and spec.block_for((64, 768), 4) == 32
    assert spec.block_for((24, 28), 4) is None and spec.block_for((24, 28), 8) == 0
    assert expert_bits("int8").block_for((2048, 768), 8) == 32 and expert_bits(None) is None


@pytest.mark.parametrize("quantize", ["int8", Int4(block_size=16)])
def test_the_routers_stay_float(moe_model, quantize, tmp_path):
    """The products giving QMoE its router logits stay float MatMuls (as llama.cpp keeps
    ffn_gate_inp in its 4-bit files); every other product is quantized."""
    export_onnx(moe_model, tmp_path, quantize=quantize, verify=False)
    graph = onnx.load(sorted(tmp_path.glob("*.onnx"))[0], load_external_data=False).graph
    producers = {out: n for n in graph.node for out in n.output}
    routers = [producers[n.input[1]] for n in graph.node if n.op_type == "QMoE"]
    assert len(routers) == 2 and all(r.op_type == "MatMul" for r in routers)
    float_weights = {t.name for t in graph.initializer if t.data_type == onnx.TensorProto.FLOAT}
    assert all(r.input[1] in float_weights and ".router." in r.input[1] for r in routers)
    others = [n for n in graph.node if n.op_type == "MatMul" and n not in routers
              and n.input[1] in float_weights]
    assert not others, [n.name for n in others]


def _gguf_experts(kind: str) -> tk.TransformerModel:
    """A decoder of mixtures of experts whose experts are GGUF blocks of ``kind`` (what
    ``tk.from_gguf`` gives: ``model.gguf_blocks``, the weights their dequantized values)."""
    torch.manual_seed(2)
    model = tk.build_model({"architecture": "decoder", "vocab_size": 64, "d_model": 64, "num_heads": 2,
                            "num_layers": 2, "d_ff": 64, "dropout": 0.0, "pad_id": 0,
                            "feedforward": {"name": "moe", "num_experts": 4, "top_k": 2,
                                            "normalize": True}}).eval()
    model.gguf_blocks = {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".experts." in name:
                data = quantize(p.numpy(), GGMLQuantizationType[kind])
                model.gguf_blocks[name] = GgufBlocks(kind, data, tuple(p.shape))
                p.copy_(torch.from_numpy(dequantize(data, GGMLQuantizationType[kind]).reshape(p.shape)))
    return model


@pytest.mark.parametrize(("kind", "bits"), [("Q4_0", 4), ("Q8_0", 8)])
def test_a_gguf_files_expert_blocks_are_written_as_they_are(kind, bits, tmp_path):
    """Q4_0 / Q8_0 experts: QMoE over the file's blocks (no second quantization), equal at
    accuracy level 1 to the file's values; the report says they came from the file."""
    model = _gguf_experts(kind)
    report = export_onnx(model, tmp_path, quantize=Int4(accuracy_level=1), verify=False)
    experts = {n: o for n, o in report.weight_origins.items() if ".experts." in n}
    assert len(experts) == 2 * 4 * 3 and set(experts.values()) == {f"GGUF {kind} blocks"}
    layers = [m for m in model.modules() if isinstance(m, MixtureOfExperts)]
    for (alone, node), layer in zip(_nodes_alone(tmp_path, "QMoE", 64, 4), layers, strict=True):
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        assert (attrs["expert_weight_bits"], attrs["block_size"]) == (bits, 32)
        arrays = {t.name: numpy_helper.to_array(t) for t in alone.graph.initializer}
        expert = layer.experts[1]  # the file's values, bit for bit
        gate_up = torch.stack([expert.gate.weight, expert.up.weight], dim=1).reshape(-1, 64)
        np.testing.assert_array_equal(_dequantized(arrays, node, 0)[1], gate_up.detach())
        np.testing.assert_array_equal(_dequantized(arrays, node, 1)[1], expert.down.weight.detach())
        check_node_alone(alone, node, layer, 1e-4 if bits == 4 else 3e-2)  # blocked 8 bits: int8 activations


def test_gguf_experts_with_offsets_are_quantized_here_and_said_so(tmp_path):
    """Q4_1 blocks carry a per-block offset that QMoE's integer zero points cannot hold: the
    experts are quantized from their dequantized values, and the report says why."""
    model = _gguf_experts("Q4_1")
    report = export_onnx(model, tmp_path, quantize=Int4(accuracy_level=1, eight_bit=()), verify=False)
    experts = {n: o for n, o in report.weight_origins.items() if ".experts." in n}
    assert experts and all(o.startswith("quantized here (GGUF Q4_1: QMoE holds a file's experts as they are")
                           for o in experts.values()), experts
    layers = [m for m in model.modules() if isinstance(m, MixtureOfExperts)]
    for (alone, node), layer in zip(_nodes_alone(tmp_path, "QMoE", 64, 4), layers, strict=True):
        check_node_alone(alone, node, layer, 1e-4)


def test_clamped_experts_with_biases_quantize_exactly(tmp_path):
    """gpt-oss's experts (clamped SwiGLU, biases on every projection, a router with a bias and
    the top-k softmax): QMoE keeps the float biases and the activation's attributes, and equals
    the dequantized experts at accuracy level 1."""
    torch.manual_seed(3)
    expert = {"name": "swiglu", "bias": True, "alpha": 1.702, "limit": 7.0, "up_offset": 1.0}
    model = tk.build_model({"architecture": "decoder", "vocab_size": 64, "d_model": 32, "num_heads": 2,
                            "num_layers": 2, "d_ff": 48, "dropout": 0.0, "pad_id": 0,
                            "feedforward": {"name": "moe", "num_experts": 4, "top_k": 2,
                                            "router": "softmax_topk", "router_bias": True,
                                            "expert": expert}}).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".experts." in name:
                p.mul_(8.0)  # gate/up beyond +-7: the clamp acts
    export_onnx(model, tmp_path, quantize=Int4(block_size=16, accuracy_level=1, eight_bit=()), verify=False)
    layers = [m for m in model.modules() if isinstance(m, MixtureOfExperts)]
    for (alone, node), layer in zip(_nodes_alone(tmp_path, "QMoE", 32, 4), layers, strict=True):
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        assert attrs["activation_alpha"] == pytest.approx(1.702) and attrs["swiglu_limit"] == 7.0
        assert attrs["activation_beta"] == 1.0 and node.input[4] and node.input[7]  # fc1 and fc2 biases
        check_node_alone(alone, node, layer, 1e-4)


def test_a_normalised_sigmoid_router_reaches_qmoe_as_its_log(tmp_path):
    """router 'sigmoid' with normalize: QMoE's top-k of log(sigmoid(l)), softmaxed over the k,
    is sigmoid's top-k over their sum; the router's product stays float behind -softplus(-l)."""
    torch.manual_seed(4)
    model = tk.build_model({"architecture": "decoder", "vocab_size": 64, "d_model": 32, "num_heads": 2,
                            "num_layers": 2, "d_ff": 32, "dropout": 0.0, "pad_id": 0,
                            "feedforward": {"name": "moe", "num_experts": 6, "top_k": 3,
                                            "router": "sigmoid", "normalize": True,
                                            "router_bias": True}}).eval()
    export_onnx(model, tmp_path, quantize=Int4(block_size=16, accuracy_level=1, eight_bit=()), verify=False)
    graph = onnx.load(sorted(tmp_path.glob("*.onnx"))[0], load_external_data=False).graph
    floats = {t.name for t in graph.initializer if t.data_type == onnx.TensorProto.FLOAT}
    assert sum(n.op_type == "MatMul" and ".router." in n.input[1] and n.input[1] in floats
               for n in graph.node) == 2
    layers = [m for m in model.modules() if isinstance(m, MixtureOfExperts)]
    for (alone, node), layer in zip(_nodes_alone(tmp_path, "QMoE", 32, 6), layers, strict=True):
        check_node_alone(alone, node, layer, 1e-4)
