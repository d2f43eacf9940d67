"""A GGUF file's quantized blocks as MatMulNBits weights: the dequantized rows equal gguf's own
dequantization, and onnxruntime's product equals ``x @ dequantize(W).T`` within float32
rounding, for every mapped type.

The products run at accuracy_level 1 (float32 arithmetic): level 4 quantizes the activations to
int8 per block, a second rounding (relative error ~5e-3 measured on these shapes) on top of the
file's; level 1 keeps the only error the file's own.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from transformer_kit.checkpoints.gguf.blocks import GgufBlocks
from transformer_kit.core.errors import ExportError
from transformer_kit.export.gguf_blocks import BLOCK_BYTES, gguf_rows, stacked
from transformer_kit.export.int4_nodes import dequantize_rows, gather_offset_nodes, offset_nodes

N, K = 48, 512
QUANTIZED = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")  # gguf.quants.quantize writes these
RANDOM_BLOCKS = ("Q4_K", "Q6_K")  # it does not write K-quants: random blocks with sane scales


def _f16_bytes(rng, n: int, low: float, high: float) -> np.ndarray:
    return rng.uniform(low, high, n).astype(np.float16).view(np.uint8).reshape(n, 2)


def gguf_matrix(type_name: str, seed: int = 0, n: int = N, k: int = K) -> GgufBlocks:
    """A (n, k) matrix in ``type_name`` blocks, as a GGUF file holds it."""
    rng = np.random.default_rng(seed)
    kind = GGMLQuantizationType[type_name]
    if type_name in QUANTIZED:
        data = quantize(rng.standard_normal((n, k)).astype(np.float32) * 0.05, kind)
        return GgufBlocks(type_name, data, (n, k))
    size, per = BLOCK_BYTES[type_name]
    count = n * k // per
    raw = rng.integers(0, 256, (count, size), dtype=np.uint8)
    if type_name == "Q4_K":  # d, dmin at bytes 0..3
        raw[:, 0:2] = _f16_bytes(rng, count, 1e-3, 4e-3)
        raw[:, 2:4] = _f16_bytes(rng, count, 1e-3, 4e-3)
    else:  # Q6_K: d at bytes 208..209
        raw[:, 208:210] = _f16_bytes(rng, count, 1e-4, 4e-4)
    return GgufBlocks(type_name, raw.reshape(n, -1), (n, k))


def reference(blocks: GgufBlocks) -> np.ndarray:
    """gguf's dequantization (its own numpy code), (N, K) float32."""
    return dequantize(blocks.data, GGMLQuantizationType[blocks.type_name]).reshape(blocks.shape)


def _initializer(name: str, array: np.ndarray) -> ir.Value:
    return ir.Value(name=name, shape=ir.Shape(array.shape), const_value=ir.tensor(array, name=name),
                    type=ir.TensorType(ir.DataType.from_numpy(array.dtype)))


def _session(inputs: list[ir.Value], nodes: list[ir.Node], inits: list[ir.Value]) -> ort.InferenceSession:
    graph = ir.Graph(inputs, [nodes[-1].outputs[0]], nodes=nodes, initializers=inits,
                     opset_imports={"": 21, "com.microsoft": 1})
    nodes[-1].outputs[0].type = ir.TensorType(ir.DataType.FLOAT)
    proto = ir.serde.serialize_model(ir.Model(graph, ir_version=10))
    return ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])


def matmul_nbits(rows, level: int) -> ort.InferenceSession:
    """A graph of x (M, K) -> x @ W.T through MatMulNBits (and the offsets' product)."""
    n = rows.packed.shape[0]
    x = ir.Value(name="x", shape=ir.Shape(["M", rows.k]), type=ir.TensorType(ir.DataType.FLOAT))
    inits = [_initializer("packed", rows.packed), _initializer("scales", rows.scales)]
    node = ir.node("MatMulNBits", [x, *inits], {"K": rows.k, "N": n, "bits": rows.bits,
                                                "block_size": rows.block_size, "accuracy_level": level},
                   domain="com.microsoft", name="nbits")
    nodes = [node]
    if rows.offsets is not None:
        inits.append(_initializer("offsets", rows.offsets))
        nodes += offset_nodes(x, node.outputs[0], inits[-1], rows.k, rows.block_size, "nbits")
    return _session([x], nodes, inits)


@pytest.mark.parametrize("type_name", QUANTIZED + RANDOM_BLOCKS)
def test_the_rows_dequantize_to_ggufs_values(type_name):
    blocks = gguf_matrix(type_name)
    rows = gguf_rows(blocks)
    expected = reference(blocks)
    assert rows.bits == (8 if type_name in ("Q5_0", "Q5_1", "Q8_0", "Q6_K") else 4)
    assert rows.block_size == (16 if type_name == "Q6_K" else 32) and rows.zero_points is None
    # one float32 rounding of the offset (m + 8 d, 8 d sc - dmin m) at most
    np.testing.assert_allclose(dequantize_rows(rows), expected, rtol=0,
                               atol=1e-6 * np.abs(expected).max())
    if type_name in ("Q4_0", "Q8_0", "Q5_0", "Q6_K"):  # no offsets: bit for bit
        np.testing.assert_array_equal(dequantize_rows(rows), expected)


@pytest.mark.parametrize("type_name", QUANTIZED + RANDOM_BLOCKS)
def test_onnxruntime_multiplies_by_ggufs_values(type_name):
    blocks = gguf_matrix(type_name, seed=1)
    exact = reference(blocks).astype(np.float64)
    x = np.random.default_rng(2).standard_normal((5, K)).astype(np.float32)
    expected = x.astype(np.float64) @ exact.T
    scale = np.abs(expected).max()
    float32 = np.abs(x @ exact.astype(np.float32).T - expected).max() / scale  # numpy's rounding
    got = matmul_nbits(gguf_rows(blocks), level=1).run(None, {"x": x})[0]
    error = np.abs(got - expected).max() / scale
    assert error < 2e-6 and error < 20 * max(float32, 1e-7)
    # level 4 rounds x to int8 per block: an error of its own, orders of magnitude larger
    if type_name == "Q4_0":
        coarse = matmul_nbits(gguf_rows(blocks), level=4).run(None, {"x": x})[0]
        assert np.abs(coarse - expected).max() / scale > 100 * error


def gather_block_quantized(rows) -> ort.InferenceSession:
    """A graph of ids (M,) -> W[ids] through GatherBlockQuantized (and the gathered offsets)."""
    n = rows.packed.shape[0]
    ids = ir.Value(name="ids", shape=ir.Shape(["M"]), type=ir.TensorType(ir.DataType.INT64))
    table = rows.packed.reshape(n, -1)  # (N, K / 2) for 4 bits, (N, K) for 8
    inits = [_initializer("table", table), _initializer("scales", rows.scales)]
    node = ir.node("GatherBlockQuantized", [inits[0], ids, inits[1]],
                   {"bits": rows.bits, "block_size": rows.block_size, "gather_axis": 0, "quantize_axis": 1},
                   domain="com.microsoft", name="gather")
    nodes = [node]
    if rows.offsets is not None:
        inits.append(_initializer("offsets", rows.offsets))
        nodes += gather_offset_nodes(ids, node.outputs[0], inits[-1], rows.k, rows.block_size, "gather")
    return _session([ids], nodes, inits)


@pytest.mark.parametrize("type_name", QUANTIZED + RANDOM_BLOCKS)
def test_the_embedding_gathers_ggufs_rows(type_name):
    blocks = gguf_matrix(type_name, seed=7)
    ids = np.array([5, 0, 47, 5, 30])
    got = gather_block_quantized(gguf_rows(blocks)).run(None, {"ids": ids})[0]
    expected = reference(blocks)[ids]
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6 * np.abs(expected).max())
    if type_name in ("Q4_0", "Q8_0", "Q5_0", "Q6_K"):  # no offsets: bit for bit
        np.testing.assert_array_equal(got, expected)


def test_q_k_and_v_rows_stack_when_their_layouts_agree():
    q, k, v = (gguf_rows(gguf_matrix("Q4_1", seed=s, n=n)) for s, n in ((3, 64), (4, 16), (5, 16)))
    together = stacked([q, k, v])
    np.testing.assert_array_equal(dequantize_rows(together),
                                  np.concatenate([dequantize_rows(r) for r in (q, k, v)]))
    assert stacked([q, gguf_rows(gguf_matrix("Q8_0", n=16))]) is None
    zero = stacked([gguf_rows(gguf_matrix("Q4_0", n=16)), q])  # Q4_0 has no offsets: zero
    np.testing.assert_array_equal(zero.offsets[:16], 0)


def test_unmapped_types_and_wrong_sizes_are_refused():
    with pytest.raises(ExportError, match="GGUF type Q5_K has no exact MatMulNBits layout"):
        gguf_rows(GgufBlocks("Q5_K", np.zeros((4, 176), np.uint8), (4, 256)))
    with pytest.raises(ExportError, match=r"expected \(4, 144\) bytes"):
        gguf_rows(GgufBlocks("Q4_K", np.zeros((4, 140), np.uint8), (4, 256)))
