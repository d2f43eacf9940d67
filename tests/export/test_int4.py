"""Symmetric 4-bit weights rounded to nearest (``Int4(rounding="nearest", eight_bit=(),
symmetric=True)``, the kit's int4 before the quality options of ``test_int4_quality.py``): every weight
matrix becomes MatMulNBits blocks whose dequantized values are the float32 weights rounded to
the nearest step of their block's scale, the token embedding a GatherBlockQuantized table over
the same bytes as the tied head (or float32 with ``embedding=False``), and onnxruntime's int4
graph computes what those dequantized weights give."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

import transformer_kit as tk
from tests.combinations import tiny_config
from transformer_kit.export import Int4, export_onnx
from transformer_kit.export.verify import TOP1_PROMPTS, random_ids, relative_error
from transformer_kit.runtime import OnnxModel

BLOCK = 16
OLD = {"rounding": "nearest", "eight_bit": (), "symmetric": True}
NEAREST = Int4(block_size=BLOCK, accuracy_level=1, **OLD)


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    torch.manual_seed(0)
    model = tk.build_model(tiny_config("decoder", vocab_size=300, d_model=64, d_ff=96, pad_id=0,
                                       tie_embeddings=True, positional="rotary", norm="rmsnorm")).eval()
    root = tmp_path_factory.mktemp("int4")
    reports = {"fp32": export_onnx(model, root / "fp32"),
               "int4": export_onnx(model, root / "int4", quantize=NEAREST)}
    return model, root, reports


def _graph(root, name: str, graph: str = "decoder_step") -> onnx.GraphProto:
    return onnx.load(str(root / name / f"{graph}.onnx")).graph


def dequantize(blocks: np.ndarray, scales: np.ndarray, k: int) -> np.ndarray:
    """MatMulNBits weights, symmetric: (N, k_blocks, BLOCK/2) uint8 of two 4-bit values each
    (low nibble first), scales (N * k_blocks,) -> the (K, N) float32 matrix (q - 8) * scale."""
    n = blocks.shape[0]
    q = np.stack([blocks & 0x0F, blocks >> 4], axis=-1).reshape(n, -1, BLOCK).astype(np.float32)
    values = (q - 8) * scales.reshape(n, -1, 1)
    return values.reshape(n, -1)[:, :k].T


def _nbits(graph: onnx.GraphProto) -> list[tuple[onnx.NodeProto, np.ndarray, np.ndarray]]:
    """Each MatMulNBits node, its dequantized (K, N) weights and its (N, k_blocks) scales."""
    weights = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    found = []
    for node in graph.node:
        if node.op_type == "MatMulNBits":
            attrs = {a.name: a.i for a in node.attribute}
            assert (attrs["bits"], attrs["block_size"], attrs["accuracy_level"]) == (4, BLOCK, 1)
            assert len(node.input) == 3  # symmetric: no zero points
            blocks, scales = weights[node.input[1]], weights[node.input[2]]
            found.append((node, dequantize(blocks, scales, attrs["K"]), scales.reshape(len(blocks), -1)))
    return found


def _float_weights(graph: onnx.GraphProto) -> list[np.ndarray]:
    """The float32 export's constant MatMul weights, in graph order (a tied head as read)."""
    weights = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}
    found = []
    for node in graph.node:
        if node.op_type not in ("MatMul", "FusedMatMul"):
            continue
        b = node.input[1]
        if node.op_type == "FusedMatMul":  # a tied head: x @ table.T
            assert {a.name: a.i for a in node.attribute}["transB"] == 1
            found.append(weights[b].T)
        elif b in weights:
            found.append(weights[b])
        elif b in producer and producer[b].op_type == "Transpose" and producer[b].input[0] in weights:
            found.append(weights[producer[b].input[0]].T)
    return found


def test_every_weight_matrix_is_rounded_to_its_block_scale(exports):
    _, root, _ = exports
    quantized = _nbits(_graph(root, "int4"))
    originals = _float_weights(_graph(root, "fp32"))
    assert len(quantized) == len(originals) == 2 * 6 + 1  # q, k, v, o, two MLP products; head
    for (_, approx, scales), exact in zip(quantized, originals, strict=True):
        assert approx.shape == exact.shape
        blocks = exact.T.reshape(exact.shape[1], -1, BLOCK)  # (N, k_blocks, BLOCK)
        # symmetric: the block's largest magnitude maps to -8, so |scale| = max |w| / 8
        np.testing.assert_allclose(np.abs(scales), np.abs(blocks).max(-1) / 8, rtol=1e-6)
        steps = scales[..., None]
        rounded = np.clip(np.rint(blocks / steps), -8, 7) * steps  # round to nearest, clip to 4 bits
        matches = np.isclose(approx.T.reshape(blocks.shape), rounded, rtol=0, atol=1e-7)
        assert matches.mean() > 0.999  # (a tie at .5 may round either way)
        assert (approx.T.reshape(blocks.shape) != blocks).any()  # really quantized


def _external_bytes(tensor: onnx.TensorProto) -> tuple[str, str]:
    place = {e.key: e.value for e in tensor.external_data}
    return place["offset"], place["length"]


def test_the_embedding_and_the_tied_head_read_one_4bit_copy(exports):
    _, root, _ = exports
    graph = _graph(root, "int4")
    weights = {t.name: t for t in onnx.load(str(root / "int4" / "decoder_step.onnx"),
                                            load_external_data=False).graph.initializer}
    (gather,) = [n for n in graph.node if n.op_type == "GatherBlockQuantized"]
    attrs = {a.name: a.i for a in gather.attribute}
    assert [attrs[k] for k in ("bits", "block_size", "gather_axis", "quantize_axis")] == [4, BLOCK, 0, 1]
    head = _nbits(graph)[-1][0]  # the product nearest the logits
    assert head.output[0] in {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    assert _external_bytes(weights[gather.input[0]]) == _external_bytes(weights[head.input[1]])
    assert _external_bytes(weights[gather.input[2]]) == _external_bytes(weights[head.input[2]])
    assert not [n for n in graph.node if n.op_type == "Gather" and n.input[0] in weights
                and weights[n.input[0]].data_type == onnx.TensorProto.FLOAT]


def test_a_float_embedding_stays_a_float32_gather(exports, tmp_path):
    model, _, _ = exports
    export_onnx(model, tmp_path / "float-embedding", verify=False,
                quantize=Int4(block_size=BLOCK, accuracy_level=1, embedding=False, **OLD))
    graph = _graph(tmp_path, "float-embedding")
    weights = {t.name: t for t in graph.initializer}
    gathers = [n for n in graph.node if n.op_type == "Gather" and n.input[0] in weights]
    assert gathers and all(weights[n.input[0]].data_type == onnx.TensorProto.FLOAT for n in gathers)
    assert not [n for n in graph.node if n.op_type == "GatherBlockQuantized"]
    assert len(_nbits(graph)) == 2 * 6 + 1


def _with_dequantized_weights(graph: onnx.GraphProto) -> onnx.ModelProto:
    """The int4 graph with each MatMulNBits replaced by a float MatMul of its dequantized weights,
    and the GatherBlockQuantized by a float Gather of its dequantized table."""
    for node, matrix, _ in _nbits(graph):
        name = node.name + ".dequantized"
        graph.initializer.append(numpy_helper.from_array(matrix.astype(np.float32), name))
        index = list(graph.node).index(node)
        graph.node.remove(node)
        graph.node.insert(index, onnx.helper.make_node("MatMul", [node.input[0], name], list(node.output)))
    weights = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    for node in [n for n in graph.node if n.op_type == "GatherBlockQuantized"]:
        table, scales = weights[node.input[0]], weights[node.input[2]]
        rows = table.shape[0]
        name = node.name + ".dequantized"
        matrix = dequantize(table.reshape(rows, -1, BLOCK // 2), scales, 2 * table.shape[1]).T
        graph.initializer.append(numpy_helper.from_array(matrix.astype(np.float32), name))
        index = list(graph.node).index(node)
        graph.node.remove(node)
        graph.node.insert(index, onnx.helper.make_node("Gather", [name, node.input[1]], list(node.output)))
    return graph


def test_onnxruntime_computes_the_dequantized_products(exports, tmp_path):
    import onnxruntime as ort

    _, root, _ = exports
    proto = onnx.load(str(root / "int4" / "model.onnx"))
    reference = onnx.helper.make_model(_with_dequantized_weights(proto.graph),
                                       opset_imports=proto.opset_import)
    reference.ir_version = proto.ir_version
    ids = random_ids(3, 10, 300, 0, seed=4).numpy()
    mask = (ids != 0).astype(np.int64)
    expected = ort.InferenceSession(reference.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"input_ids": ids, "attention_mask": mask})[0]
    actual = OnnxModel(root / "int4", providers="cpu")(ids)
    assert relative_error(actual, expected) <= 1e-4


def test_the_report_measures_int4_against_float32(exports):
    model, root, reports = exports
    report = reports["int4"]
    assert report.quantization == "int4" and report.tolerance is None
    assert 0 < report.max_error < 0.5
    assert 0 <= report.top1_agreement <= 1
    ids = random_ids(*TOP1_PROMPTS, 300, 0, seed=11)
    with torch.no_grad():
        expected = model(ids).argmax(-1).numpy()
    actual = OnnxModel(root / "int4", providers="cpu")(ids.numpy()).argmax(-1)
    real = ids.numpy() != 0
    assert report.top1_agreement == pytest.approx(float((actual == expected)[real].mean()))
    # 4 bits and a float32 scale per 16 weights: 6 bits a weight, the tied table stored once
    assert report.graph_bytes["weights.data"] < 0.2 * reports["fp32"].graph_bytes["weights.data"]


def test_a_float_head_stays_a_float_matmul(exports, tmp_path):
    model, _, _ = exports
    export_onnx(model, tmp_path / "float-head", verify=False,
                quantize=Int4(block_size=BLOCK, accuracy_level=1, head=False, **OLD))
    graph = _graph(tmp_path, "float-head")
    assert len(_nbits(graph)) == 2 * 6
    weights = {t.name: t for t in graph.initializer}
    (head,) = [n for n in graph.node if n.op_type in ("MatMul", "FusedMatMul") and n.input[1] in weights]
    assert head.op_type == "FusedMatMul"  # the float32 table, read transposed: no second copy
    assert weights[head.input[1]].data_type == onnx.TensorProto.FLOAT


@pytest.mark.parametrize(("options", "message"), [
    ({"block_size": 24}, "block_size=24 is not supported"),
    ({"accuracy_level": 5}, "accuracy_level=5 is not supported"),
    ({"symmetric": 1}, "symmetric=1 must be True or False"),
    ({"block_size": True}, "block_size=True is not supported"),
])
def test_bad_int4_options_are_refused(options, message):
    with pytest.raises(tk.InputError, match=message):
        Int4(**options)


def test_the_head_is_found_behind_the_logit_transforms(tmp_path):
    """With logit_scale and logit_softcap after the head's product, int4 still quantizes the head
    (13 MatMulNBits), keeps it float with head=False (12), and the transforms run in the graph."""
    torch.manual_seed(0)
    model = tk.build_model(tiny_config("decoder", vocab_size=300, d_model=64, d_ff=96, pad_id=0,
                                       positional="rotary", norm="rmsnorm", logit_scale=0.5,
                                       logit_softcap=2.0)).eval()
    int4 = export_onnx(model, tmp_path / "int4", quantize=NEAREST)
    assert len(_nbits(_graph(tmp_path, "int4"))) == 2 * 6 + 1
    assert 0 < int4.max_error < 0.5
    export_onnx(model, tmp_path / "float-head", verify=False,
                quantize=Int4(block_size=BLOCK, accuracy_level=1, head=False, **OLD))
    graph = _graph(tmp_path, "float-head")
    assert len(_nbits(graph)) == 2 * 6
    assert "Tanh" in {n.op_type for n in graph.node}
    ids = random_ids(2, 9, 300, 0, seed=4).numpy()
    logits = OnnxModel(tmp_path / "float-head", providers="cpu")(ids)
    assert np.abs(logits).max() <= 2.0


def test_int4_with_float16_activations_writes_the_float32_exports_blocks(exports, tmp_path):
    """``dtype="float16"`` with int4 (the GPU's usual 4-bit form): the same 4-bit integers as the
    float32 export, their scales rounded to float16, float16 products, and logits within
    float16's tolerance of the float32 int4 export's (the default recipe: its 8-bit roles and
    calibration take the same float32 weights)."""
    model, _, _ = exports
    recipe = Int4(block_size=BLOCK)
    export_onnx(model, tmp_path / "f32", quantize=recipe, verify=False)
    report = export_onnx(model, tmp_path / "f16", dtype="float16", quantize=recipe)
    assert report.dtype == "float16" and report.errors  # verified against PyTorch: reported
    blocks = ("MatMulNBits", "GatherBlockQuantized")
    found = []
    for name in ("f32", "f16"):
        graph = onnx.load(str(tmp_path / name / "decoder_step.onnx")).graph
        arrays = {t.name: numpy_helper.to_array(t, base_dir=str(tmp_path / name)) for t in graph.initializer}
        found.append([(n, arrays) for n in graph.node if n.op_type in blocks])
    assert len(found[0]) == len(found[1]) > 0
    for (single, floats), (half, halves) in zip(*found, strict=True):
        packed = 1 if single.op_type == "MatMulNBits" else 0
        np.testing.assert_array_equal(floats[single.input[packed]], halves[half.input[packed]])
        scales = halves[half.input[2]]
        assert scales.dtype == np.float16
        np.testing.assert_array_equal(scales, floats[single.input[2]].astype(np.float16))
    ids = np.random.default_rng(0).integers(1, 300, (2, 9))
    half_logits = OnnxModel(tmp_path / "f16", "cpu")(ids)
    assert half_logits.dtype == np.float16
    assert relative_error(half_logits.astype(np.float32), OnnxModel(tmp_path / "f32", "cpu")(ids)) < 2e-2
