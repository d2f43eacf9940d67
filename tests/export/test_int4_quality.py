"""Int4's quality options: ``rounding="search"`` (each block's scale of least squared error, the
default) and ``eight_bit`` (roles of weights kept in 8-bit blocks; the default keeps the token
embedding and its tied head and every product of the first eighth of the layers in 8 bits), with
symmetric 4-bit blocks by default, calibrated (``test_calibration.py``). The blocks are checked
against the float weights, the exported graph against onnxruntime's reading of its own bytes and
against the float model, and the options against the manifest (``test_int4.py`` covers nearest
rounding in 4 bits)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

import transformer_kit as tk
from tests.combinations import tiny_config
from transformer_kit.export import Int4, export_onnx
from transformer_kit.export.calibration import calibration_ids, input_importance
from transformer_kit.export.int4_nodes import QuantizedRows, dequantize_rows, quantize_rows
from transformer_kit.export.verify import random_ids, relative_error
from transformer_kit.export.weight_writer import early_layers
from transformer_kit.runtime import OnnxModel

BLOCK = 16
VOCAB = 300
#: The products of a layer of the tiny model, by weight name.
LAYER_PRODUCTS = ("self_attention.q_proj", "self_attention.k_proj", "self_attention.v_proj",
                  "self_attention.o_proj", "feedforward.linear1", "feedforward.linear2")


def _weights(shape=(200, 96), seed=0) -> np.ndarray:
    """Gaussian weights with 1 % of them 8 times larger (outliers, as trained weights have)."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(shape).astype(np.float32)
    w[rng.random(shape) < 0.01] *= 8
    return w


def _block_errors(q: QuantizedRows, w: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """Each block's squared error (N, K / block), each column's weighed by ``weights`` (K,)."""
    squares = (dequantize_rows(q) - w) ** 2 * (1 if weights is None else weights)
    return squares.reshape(w.shape[0], -1, q.block_size).sum(-1)


@pytest.mark.parametrize("symmetric", [True, False], ids=["symmetric", "asymmetric"])
def test_the_search_never_loses_to_nearest_rounding_in_any_block(symmetric):
    w = _weights()
    nearest = quantize_rows(w, 32, symmetric, rounding="nearest")  # onnxruntime's own kernel
    searched = quantize_rows(w, 32, symmetric, rounding="search")
    assert searched.packed.shape == nearest.packed.shape == (200, 3, 16)
    assert (searched.zero_points is None) == symmetric
    before, after = _block_errors(nearest, w), _block_errors(searched, w)
    assert (after <= before * (1 + 1e-5) + 1e-12).all()
    assert after.sum() < 0.96 * before.sum()  # measured 0.94 on these weights, both kinds


@pytest.mark.parametrize("rounding", ["nearest", "search"])
def test_eight_bit_blocks_are_sixteen_times_finer(rounding):
    w = _weights()
    eight = quantize_rows(w, 32, True, bits=8, rounding=rounding)
    four = quantize_rows(w, 32, True, rounding=rounding)
    assert (eight.bits, eight.packed.shape, eight.zero_points) == (8, (200, 3, 32), None)
    blocks = w.reshape(200, 3, 32)
    if rounding == "nearest":  # the block's largest magnitude is -128 steps: exact
        np.testing.assert_allclose(np.abs(eight.scales), np.abs(blocks).max(-1) / 128, rtol=1e-6)
        error = np.abs(dequantize_rows(eight) - w).reshape(blocks.shape)
        # half a step, a whole one where +128 steps clip to 127
        assert (error <= 0.5001 * np.abs(eight.scales)[..., None]).mean() > 0.999
        assert (error <= 1.0001 * np.abs(eight.scales)[..., None]).all()
    rms = [float(np.sqrt(((dequantize_rows(q) - w) ** 2).mean())) for q in (four, eight)]
    assert 14 < rms[0] / rms[1] < 18  # measured 15.8 (nearest) and 16.1 (search)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return tk.build_model(tiny_config("decoder", vocab_size=VOCAB, d_model=64, d_ff=96, pad_id=0,
                                      tie_embeddings=True, positional="rotary", norm="rmsnorm")).eval()


def _load(folder, graph: str = "decoder_step") -> onnx.ModelProto:
    return onnx.load(str(folder / f"{graph}.onnx"))


def _rows(node: onnx.NodeProto, weights: dict[str, np.ndarray]) -> QuantizedRows:
    """The blocks a MatMulNBits or GatherBlockQuantized node reads, as the (N, K) rows they hold."""
    attrs = {a.name: a.i for a in node.attribute}
    bits, block = attrs["bits"], attrs["block_size"]
    if node.op_type == "MatMulNBits":
        data, scales = weights[node.input[1]], weights[node.input[2]]
        zero_points = weights[node.input[3]] if len(node.input) > 3 else None
        k = attrs["K"]
    else:
        data, scales = weights[node.input[0]], weights[node.input[2]]
        zero_points = weights[node.input[3]] if len(node.input) > 3 else None
        k = data.shape[1] * 8 // bits
    n = data.shape[0]
    width = block // 2 if bits == 4 else block
    return QuantizedRows(data.reshape(n, -1, width), scales.reshape(n, -1), zero_points, block, k, bits=bits)


def _quantized_nodes(proto: onnx.ModelProto) -> list[tuple[onnx.NodeProto, QuantizedRows]]:
    weights = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    return [(n, _rows(n, weights)) for n in proto.graph.node
            if n.op_type in ("MatMulNBits", "GatherBlockQuantized")]


def _bits(node: onnx.NodeProto) -> int:
    return next(a.i for a in node.attribute if a.name == "bits")


def _weight_name(node: onnx.NodeProto) -> str:
    """The state-dict name of the weight a quantized node reads, by the name of its bytes."""
    return node.input[1 if node.op_type == "MatMulNBits" else 0].split(".int4")[0]


def _float_rows(model: torch.nn.Module, node: onnx.NodeProto) -> np.ndarray:
    """The model's float (N, K) rows a quantized node stands for."""
    return dict(model.named_parameters(remove_duplicate=False))[_weight_name(node)].detach().numpy()


def _dequantized(proto: onnx.ModelProto) -> bytes:
    """``proto`` with each quantized node replaced by a float MatMul / Gather of the rows its
    bytes hold."""
    graph = proto.graph
    for node, rows in _quantized_nodes(proto):
        name = node.name + ".dequantized"
        matrix = dequantize_rows(rows)
        if node.op_type == "MatMulNBits":
            matrix, new = matrix.T, onnx.helper.make_node("MatMul", [node.input[0], name], list(node.output))
        else:
            new = onnx.helper.make_node("Gather", [name, node.input[1]], list(node.output))
        graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(matrix, np.float32), name))
        index = list(graph.node).index(node)
        graph.node.remove(node)
        graph.node.insert(index, new)
    return proto.SerializeToString()


@pytest.fixture(scope="module")
def exports(model, tmp_path_factory):
    root = tmp_path_factory.mktemp("int4-quality")
    options = {"nearest": Int4(block_size=BLOCK, accuracy_level=1, rounding="nearest", eight_bit=()),
               "search": Int4(block_size=BLOCK, accuracy_level=1, eight_bit=()),
               "default": Int4(block_size=BLOCK, accuracy_level=1),
               "level4": Int4(block_size=BLOCK)}
    for name, quantize in options.items():
        export_onnx(model, root / name, quantize=quantize, verify=False)
    return root


def test_the_default_keeps_the_sensitive_weights_in_8_bits_and_searches_the_rest_calibrated(model, exports):
    folder = exports / "level4"
    assert OnnxModel(folder).manifest.quantization_options == {
        "method": "int4", "block_size": BLOCK, "accuracy_level": 4, "symmetric": True, "head": True,
        "embedding": True, "rounding": "search", "eight_bit": ["embedding", "early"],
        "calibration": "default (512 tokens)", "search_factors": [0.9, 1.0, 1.1]}
    nodes = _quantized_nodes(_load(folder))
    table = [n for n, _ in nodes if n.op_type == "GatherBlockQuantized"]
    head = [n for n, _ in nodes if n.op_type == "MatMulNBits" and n.input[1].startswith("head.")]
    assert len(table) == len(head) == 1 and _bits(table[0]) == _bits(head[0]) == 8
    # 2 layers: the first (an eighth of 2, at least one) in 8 bits, the second's q, k, v, o,
    # linear1 and linear2 in 4; the table and the head in 8
    eight = {n.input[1].split(".int4")[0] for n, _ in nodes if n.op_type == "MatMulNBits" and _bits(n) == 8}
    assert eight == {"head.weight"} | {f"decoder.layers.0.{part}.weight" for part in LAYER_PRODUCTS}
    assert sorted(_bits(n) for n, _ in nodes) == [4] * 6 + [8] * 8
    assert all(len(n.input) == 3 for n, _ in nodes if n.op_type == "MatMulNBits")  # no zero points
    raw = {t.name: {e.key: e.value for e in t.external_data}
           for t in onnx.load(str(folder / "decoder_step.onnx"), load_external_data=False).graph.initializer}
    assert raw[table[0].input[0]]["offset"] == raw[head[0].input[1]]["offset"]  # one 8-bit copy
    nearest = dict((n.name, rows) for n, rows in _quantized_nodes(_load(exports / "nearest")))
    importance = input_importance(model, calibration_ids(model, "default"))  # the default calibrates
    for node, rows in nodes:
        w = _float_rows(model, node)
        assert dequantize_rows(rows).shape == w.shape
        if rows.bits == 8:  # 8 bits: within one 8-bit step of the block's scale
            step = np.abs(rows.scales).repeat(BLOCK, axis=1)
            assert (np.abs(dequantize_rows(rows) - w) <= step * 1.0001).all()
        else:  # 4 bits: no block's error, each column weighed by its calibrated importance, worse
            weights = importance[_weight_name(node)]  # than onnxruntime's nearest rounding
            assert (_block_errors(rows, w, weights)
                    <= _block_errors(nearest[node.name], w, weights) * (1 + 1e-5) + 1e-12).all()


def test_below_level_4_the_8bit_head_reads_the_table_values_in_float32(exports):
    """onnxruntime 1.31's CPU kernel dequantizes 8-bit matrices on every call below level 4, so
    the tied head's product reads the 8-bit table's values as float32 (and so do the first
    layer's products); the embedding stays 8-bit."""
    proto = _load(exports / "default")
    nodes = _quantized_nodes(proto)
    (table,) = [rows for n, rows in nodes if n.op_type == "GatherBlockQuantized"]
    assert table.bits == 8 and sorted(_bits(n) for n, _ in nodes) == [4] * 6 + [8]
    floats = {n.input[1] for n in proto.graph.node if n.op_type == "FusedMatMul"}
    assert floats == {"head.weight.values"} | {f"decoder.layers.0.{part}.weight.values"
                                               for part in LAYER_PRODUCTS}
    weights = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    (head,) = [n for n in proto.graph.node
               if n.op_type == "FusedMatMul" and n.input[1] == "head.weight.values"]
    np.testing.assert_array_equal(weights[head.input[1]], dequantize_rows(table))


@pytest.mark.parametrize(("name", "tolerance"), [("search", 1e-4), ("default", 1e-4), ("level4", 0.01)])
def test_onnxruntime_computes_the_products_of_the_written_blocks(exports, name, tolerance):
    """In float32 arithmetic (level 1) within float rounding; at level 4 within the int8
    rounding of the activations (measured 0.0026)."""
    import onnxruntime as ort

    ids = random_ids(3, 10, VOCAB, 0, seed=4).numpy()
    mask = (ids != 0).astype(np.int64)
    reference = ort.InferenceSession(_dequantized(_load(exports / name, "model")),
                                     providers=["CPUExecutionProvider"])
    expected = reference.run(None, {"input_ids": ids, "attention_mask": mask})[0]
    actual = OnnxModel(exports / name, providers="cpu")(ids)
    assert relative_error(actual, expected) <= tolerance


def test_each_lever_brings_the_logits_closer_to_the_float_model(model, exports):
    ids = random_ids(4, 24, VOCAB, 0, seed=11)
    with torch.no_grad():
        expected = model(ids).numpy()
    real = ids.numpy() != 0
    errors = {}
    for name in ("nearest", "search", "default"):
        logits = OnnxModel(exports / name, providers="cpu")(ids.numpy())
        errors[name] = relative_error(logits[real], expected[real])
    # measured on this model: nearest 0.0548, search 0.0523, default (8-bit tied table) 0.0163
    assert errors["default"] < 0.5 * errors["search"] and errors["search"] < errors["nearest"] < 0.1, errors


def test_the_value_and_down_roles_pick_their_products(model, tmp_path):
    export_onnx(model, tmp_path, verify=False,
                quantize=Int4(block_size=BLOCK, eight_bit=("down", "value")))  # level 4: 8-bit kernels
    assert OnnxModel(tmp_path).manifest.quantization_options["eight_bit"] == ["value", "down"]
    bits = {n.input[1 if n.op_type == "MatMulNBits" else 0].split(".int4")[0]: _bits(n)
            for n, _ in _quantized_nodes(_load(tmp_path))}
    eight = {name for name, b in bits.items() if b == 8}
    assert eight == {f"decoder.layers.{i}.{part}.weight" for i in (0, 1)
                     for part in ("self_attention.v_proj", "feedforward.linear2")}
    assert len(bits) == 13 and set(bits.values()) == {4, 8}  # the tied table and head: 4 bits


@pytest.mark.parametrize(("options", "message"), [
    ({"rounding": "gptq"}, "rounding='gptq' is not supported; choose 'search'"),
    ({"rounding": None}, "rounding=None is not supported"),
    ({"eight_bit": ("attention",)}, r"eight_bit=\('attention',\) is not supported; give a tuple of roles"),
    ({"eight_bit": 8}, "eight_bit=8 is not supported"),
    ({"eight_bit": ("head", 1)}, r"eight_bit=\('head', 1\) is not supported"),
])
def test_bad_quality_options_are_refused(options, message):
    with pytest.raises(tk.InputError, match=message):
        Int4(**options)


def test_roles_are_kept_in_one_order():
    assert Int4(eight_bit=["down", "embedding"]).eight_bit == ("embedding", "down")
    assert Int4(eight_bit=("early", "down", "embedding")).eight_bit == ("embedding", "down", "early")
    assert Int4(eight_bit="head").eight_bit == ("head",)
    assert Int4(eight_bit=()).eight_bit == ()


@pytest.mark.parametrize(("layers", "early"), [(1, [0]), (2, [0]), (8, [0]), (9, [0, 1]), (24, [0, 1, 2]),
                                               (30, [0, 1, 2, 3])])
def test_the_early_role_is_the_first_eighth_of_each_stack(layers, early):
    """llama.cpp's ``use_more_bits`` rule (layer i of n with i < n / 8), stack by stack."""
    names = [f"{stack}.layers.{i}.feedforward.linear2.weight" for stack in ("encoder", "decoder")
             for i in range(layers)] + ["decoder.layers.0.self_attention.q_proj.weight", "head.weight"]
    assert early_layers(names) == {(f"{stack}.layers", i) for stack in ("encoder", "decoder") for i in early}
    longer = [f"decoder.layers.{i}.x.weight" for i in range(2 * layers)]  # stacks counted apart
    assert early_layers(names[:layers] + longer) == ({("encoder.layers", i) for i in early}
                                                     | {("decoder.layers", i) for i in range(2 * layers)
                                                        if 8 * i < 2 * layers})
