"""An int4 export of a model with GGUF blocks (``model.gguf_blocks``, as ``tk.from_gguf`` gives)
writes the file's own blocks instead of quantizing the dequantized weights again: its logits
equal the float32 export of the same dequantized weights within float rounding, orders of
magnitude closer than the kit's own int4 of those weights, and the report says which matrices
came from the file's blocks."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

import transformer_kit as tk
from tests.combinations import tiny_config
from transformer_kit.checkpoints.gguf.blocks import GgufBlocks
from transformer_kit.export import Int4, export_onnx
from transformer_kit.export.verify import random_ids, relative_error
from transformer_kit.runtime import OnnxModel

VOCAB = 300
LEVEL1 = Int4(accuracy_level=1)  # float32 arithmetic: no int8 rounding of the activations


def _type_of(name: str) -> str:
    if name == "decoder.layers.1.self_attention.o_proj.weight":
        return "Q5_K"  # not mapped: quantized by the kit, and said so
    if "feedforward.down" in name:
        return "Q8_0"  # 8 bits
    if "feedforward" in name:
        return "Q4_0"  # gate and up: stacked as one product, no offsets
    return "Q4_1"  # attention and the tied embedding / head: offsets (mins)


def _q5_k_blocks(shape: tuple[int, int], seed: int) -> np.ndarray:
    """Random Q5_K super-blocks (176 bytes of 256 weights), d and dmin giving weights of the
    other matrices' size (|w| < 0.05)."""
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (shape[0] * shape[1] // 256, 176), dtype=np.uint8)
    raw[:, 0:4] = rng.uniform(1e-5, 2.5e-5, (len(raw), 2)).astype(np.float16).view(np.uint8)
    return raw.reshape(shape[0], -1)


def gguf_model(seed: int = 0) -> tk.TransformerModel:
    """A tied rotary decoder whose matrices are GGUF blocks of its random weights, holding
    their dequantized values (what ``tk.from_gguf`` returns)."""
    torch.manual_seed(seed)
    model = tk.build_model(tiny_config("decoder", vocab_size=VOCAB, d_model=256, d_ff=512, pad_id=0,
                                       tie_embeddings=True, positional="rotary", norm="rmsnorm",
                                       feedforward="swiglu", num_layers=2)).eval()
    model.gguf_blocks = {}
    with torch.no_grad():
        for i, (name, p) in enumerate(model.named_parameters()):
            if p.dim() != 2:
                continue
            kind = _type_of(name)
            data = (_q5_k_blocks(tuple(p.shape), i) if kind == "Q5_K" else
                    quantize(p.numpy() * 0.5, GGMLQuantizationType[kind]))
            model.gguf_blocks[name] = GgufBlocks(kind, data, tuple(p.shape))
            p.copy_(torch.from_numpy(dequantize(data, GGMLQuantizationType[kind]).reshape(p.shape)))
    return model


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    model = gguf_model()
    root = tmp_path_factory.mktemp("gguf-int4")
    steps = {"gguf": [], "kit": []}
    reports = {"fp32": export_onnx(model, root / "fp32", verify=False),
               "gguf": export_onnx(model, root / "gguf", quantize=LEVEL1, verify=False,
                                   progress=lambda step, done, total: steps["gguf"].append(step))}
    blocks = model.gguf_blocks
    del model.gguf_blocks
    reports["kit"] = export_onnx(model, root / "kit", quantize=LEVEL1, verify=False,
                                 progress=lambda step, done, total: steps["kit"].append(step))
    model.gguf_blocks = blocks
    reports["steps"] = steps
    return model, root, reports


def test_the_logits_are_the_dequantized_weights_not_a_second_quantization(exports):
    _, root, _ = exports
    ids = random_ids(3, 12, VOCAB, 0, seed=5).numpy()
    expected = OnnxModel(root / "fp32", providers="cpu")(ids)
    from_file = relative_error(OnnxModel(root / "gguf", providers="cpu")(ids), expected)
    requantized = relative_error(OnnxModel(root / "kit", providers="cpu")(ids), expected)
    # one matrix of 13 (the Q5_K one) is quantized again, its error the export's only one
    assert 1e-5 < from_file < requantized / 2


def test_with_every_matrix_mapped_the_logits_match_within_float_rounding(tmp_path):
    model = gguf_model(seed=1)
    name = "decoder.layers.1.self_attention.o_proj.weight"
    with torch.no_grad():
        data = quantize(model.get_parameter(name).numpy(), GGMLQuantizationType.Q4_1)
        model.gguf_blocks[name] = GgufBlocks("Q4_1", data, (256, 256))
        model.get_parameter(name).copy_(torch.from_numpy(dequantize(data, GGMLQuantizationType.Q4_1)))
    ids = random_ids(3, 12, VOCAB, 0, seed=6).numpy()
    export_onnx(model, tmp_path / "fp32", verify=False)
    steps = []
    report = export_onnx(model, tmp_path / "gguf", quantize=LEVEL1, verify=False,
                         progress=lambda step, done, total: steps.append(step))
    assert len(report.from_file_blocks) == len(report.weight_origins) == 2 * 6 + 1
    assert not [s for s in steps if "calibrat" in s]  # nothing quantized here: no calibration pass
    error = relative_error(OnnxModel(tmp_path / "gguf", providers="cpu")(ids),
                           OnnxModel(tmp_path / "fp32", providers="cpu")(ids))
    assert error < 1e-5  # the kit requantizing instead costs far more: the first test of the module


def test_the_calibration_pass_runs_when_the_kit_quantizes_a_product(exports):
    """The Q5_K matrix of the module's model is quantized by the kit, so its export calibrates
    (when that product is reached), as the export without any file blocks does (before tracing)."""
    steps = exports[2]["steps"]
    assert "calibrating 4-bit weights" in steps["gguf"] and "calibrating 4-bit weights" in steps["kit"]


def test_the_report_says_which_matrices_came_from_the_file(exports):
    _, _, reports = exports
    origins = reports["gguf"].weight_origins
    assert origins["decoder.layers.0.self_attention.q_proj.weight"] == "GGUF Q4_1 blocks"
    assert origins["decoder.layers.0.feedforward.{gate,up}.weight"] == "GGUF Q4_0 blocks"
    assert origins["decoder.layers.1.feedforward.down.weight"].startswith("GGUF Q8_0 values")
    assert origins["head.weight"] == "GGUF Q4_1 blocks"
    assert origins["decoder.layers.1.self_attention.o_proj.weight"] == (
        "quantized here (GGUF Q5_K has no exact MatMulNBits layout)")
    assert "12 written from the GGUF file's blocks, 1 quantized here" in str(reports["gguf"])
    assert reports["kit"].weight_origins == {}


def _graph(folder) -> onnx.GraphProto:
    return onnx.load(str(folder / "decoder_step.onnx"), load_external_data=False).graph


def _bits(graph: onnx.GraphProto) -> list[int]:
    return sorted(a.i for n in graph.node if n.op_type == "MatMulNBits"
                  for a in n.attribute if a.name == "bits")


def test_the_graph_reads_the_files_bits(exports):
    _, root, reports = exports
    graph = _graph(root / "gguf")
    assert _bits(graph) == [4] * 11  # q, k, v, o, gate+up per layer (but layer 1's o), the head
    (gather,) = [n for n in graph.node if n.op_type == "GatherBlockQuantized"]
    assert {a.name: a.i for a in gather.attribute}["bits"] == 4
    # the Q4_1 mins: an offsets product after each Q4_1 product (q, k, v, o of layer 0, q, k, v
    # of layer 1, the head), a gathered offset after the table; the Q8_0 down products in
    # float32 at accuracy_level 1 (2 more FusedMatMul)
    assert sum(n.op_type == "FusedMatMul" for n in graph.node) == 8 + 2
    assert any(n.op_type == "Gather" and n.input[0].endswith(".offsets") for n in graph.node)
    assert reports["gguf"].weight_origins["decoder.layers.0.feedforward.down.weight"].startswith(
        "GGUF Q8_0 values in float32")


def test_at_accuracy_level_4_8_bit_blocks_stay_8_bits(exports, tmp_path):
    model, _, _ = exports
    report = export_onnx(model, tmp_path / "level4", quantize=Int4(accuracy_level=4), verify=False)
    assert _bits(_graph(tmp_path / "level4")) == [4] * 11 + [8] * 2  # the Q8_0 down products
    assert report.weight_origins["decoder.layers.1.feedforward.down.weight"] == "GGUF Q8_0 blocks"


def test_weights_changed_after_loading_are_quantized_not_replaced_by_the_file(tmp_path):
    model = gguf_model(seed=2)
    name = "decoder.layers.0.self_attention.v_proj.weight"
    with torch.no_grad():
        model.get_parameter(name).mul_(1.01)
    report = export_onnx(model, tmp_path / "changed", quantize=LEVEL1, verify=False)
    assert report.weight_origins[name].startswith("quantized here (the model's weights are not")
    assert report.weight_origins["decoder.layers.0.self_attention.k_proj.weight"] == "GGUF Q4_1 blocks"


def test_blocks_of_another_shape_are_refused(tmp_path):
    model = gguf_model(seed=3)
    name = "decoder.layers.0.self_attention.q_proj.weight"
    model.gguf_blocks[name] = GgufBlocks("Q4_1", model.gguf_blocks[name].data[:128], (128, 256))
    with pytest.raises(tk.ExportError, match=r"stands for a \(128, 256\) matrix but the parameter is"):
        export_onnx(model, tmp_path / "wrong", quantize=LEVEL1, verify=False)
