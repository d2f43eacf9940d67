"""4-bit blocks as onnxruntime reads them: ``MatMulNBits`` for products and
``GatherBlockQuantized`` for embedding tables, over the same bytes.

A matrix W (N, K) whose rows are quantized in blocks of ``block_size`` along K becomes packed
uint8 nibbles (N, K / block_size, block_size / 2), a float scale per block (N, K / block_size)
and, for asymmetric blocks, packed zero points (N, ceil(K / block_size / 2)); symmetric blocks
have the zero point 8. ``MatMulNBits`` reads them as the weight of ``x @ W.T``;
``GatherBlockQuantized`` reads the same bytes as a (N, K / 2) table whose rows it gathers, so a
tied output head and its embedding share one quantized copy (as onnxruntime-genai's do).
Nearest rounding in 4 bits comes from onnxruntime's own kernel (``quantize_matmul_4bits``, the
one its ``MatMulNBitsQuantizer`` calls: the same bits as that quantizer); the least-squares
search (:func:`search_blocks`) and 8-bit blocks are computed here in numpy, chunk by chunk, the
chunks on every core.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from transformer_kit.core.errors import ExportError

#: Rows quantized per kernel call (the kernel wants them transposed: one chunk's copy at a time).
CHUNK_ROWS = 4096
#: Weights a thread searches at once: its working arrays (a few times that many floats) stay in
#: the core's cache instead of streaming from memory.
SEARCH_CHUNK = 1 << 18


def _workers() -> int:
    """Threads for the block search: this process's cores (at most 8)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(8, cores or 1))


@dataclass
class QuantizedRows:
    """A (N, K) matrix in 4-bit (or 8-bit) blocks along K:
    ``w = (q - zero_point) * scale + offset`` per block."""

    packed: np.ndarray  # (N, K / block_size, block_size / 2) uint8; 8 bits: (.., block_size)
    scales: np.ndarray  # (N, K / block_size) float32
    zero_points: np.ndarray | None  # (N, ceil(K / block_size / 2)) uint8, or None: 8 (128 for 8 bits)
    block_size: int
    k: int  # the matrix's K (the blocks may pad it)
    bits: int = 4
    #: (N, K / block_size) float32 added to every weight of a block (a GGUF file's mins,
    #: ``gguf_blocks.py``), or None; written as a separate product (:func:`offset_nodes`).
    offsets: np.ndarray | None = None


def quantize_rows(rows: np.ndarray, block_size: int, symmetric: bool, bits: int = 4,
                  rounding: str = "nearest", importance: np.ndarray | None = None) -> QuantizedRows:
    """Quantize ``rows`` (N, K) float32 in blocks of ``block_size`` along K, to ``bits`` (4 or 8).

    ``rounding="nearest"``: each block's scale from its largest magnitude (symmetric: that
    weight becomes -8, or -128 in 8 bits) or from its range (asymmetric, zero included), the
    weights rounded to the nearest step; 4 bits by onnxruntime's own kernel
    (``quantize_matmul_4bits``, the one its ``MatMulNBitsQuantizer`` calls: the same bits).
    ``rounding="search"``: :func:`search_blocks`, the scale of least squared error per block,
    each column's error weighted by ``importance`` (K,) when given (how large the product's
    inputs are in that column: :mod:`~transformer_kit.export.calibration`).
    8 bits are always symmetric (zero point 128)."""
    if bits == 8 or rounding == "search":
        return _numpy_rows(rows, block_size, symmetric or bits == 8, bits, rounding, importance)
    from onnxruntime.capi._pybind_state import quantize_matmul_4bits

    n, k = rows.shape
    blocks = (k + block_size - 1) // block_size
    packed = np.zeros((n, blocks, block_size // 2), dtype=np.uint8)
    scales = np.zeros((n, blocks), dtype=np.float32)
    zero_points = np.zeros((n, (blocks + 1) // 2), dtype=np.uint8)
    for start in range(0, n, CHUNK_ROWS):  # rows are independent: a transposed copy of a chunk only
        stop = min(n, start + CHUNK_ROWS)
        # the kernel reads the weight of x @ B as B (K, N), row-major
        weight = np.ascontiguousarray(rows[start:stop].T, dtype=np.float32)
        quantize_matmul_4bits(packed[start:stop], weight, scales[start:stop], zero_points[start:stop],
                              block_size, stop - start, k, symmetric)
    return QuantizedRows(packed, scales, None if symmetric else zero_points, block_size, k)


#: Scales tried per block by ``rounding="search"``, as multiples of the nearest-rounding scale
#: (both signs for symmetric blocks: the largest magnitude may land on -8 or on +7). Three, not
#: more: more candidates lower each block's weighted error but fit the calibration text, and
#: held text's perplexity gets worse (docs/benchmarks/history.md).
SEARCH_FACTORS = (0.9, 1.0, 1.1)


def search_blocks(x: np.ndarray, bits: int, symmetric: bool, search: bool = True,
                  weights: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The integers, scales and zero points of blocks ``x`` (..., block) float32 that minimize
    each block's squared error ``sum(weights * (x - (q - zero) * scale)^2)`` over candidate
    scales (:data:`SEARCH_FACTORS` times the nearest-rounding scale, both signs when symmetric),
    each candidate's integers refitted with the least-squares scale
    ``<weights * x, q - zero> / <weights * (q - zero), q - zero>`` (as llama.cpp's
    ``make_qx_quants``). ``weights`` (..., block), positive, broadcast against ``x``: None
    weighs every weight alike. The nearest-rounding scale is one of the candidates, so no
    block's (weighted) error exceeds its nearest rounding's.

    The block-wise sums are batched matrix products (``<a, b>`` over each block), and the
    integers of the best candidate are made again once at the end rather than kept for each.
    With the refitted scale a 4-bit candidate's error is ``<w x, x> - <w x, d>^2 / <w d, d>`` (d
    the integers less the zero point): the search compares the last term and computes no
    residual. An 8-bit block's error is about 1/65536 of ``<w x, x>``, below float32's rounding
    of that difference, so 8-bit candidates compare their residuals.

    ``search=False``: the nearest-rounding scale alone, not refitted (round to nearest).

    Returns q (..., block) int in [0, 2**bits), scale (...) float32, zero point (...) int
    (2**(bits-1) when symmetric)."""
    levels = 2 ** bits
    x = x.astype(np.float32, copy=False)
    w = None if weights is None else weights.astype(np.float32)
    wx = x if w is None else w * x
    if symmetric:
        half = levels // 2
        index = np.abs(x).argmax(-1)[..., None]
        peak = np.take_along_axis(x, index, -1)  # the signed largest magnitude
        candidates = ([peak / (sign * half * f) for f in SEARCH_FACTORS for sign in (-1, 1)] if search
                      else [peak / -half])
        low, high, lo = -half, half - 1, None
    else:
        lo, hi = np.minimum(x.min(-1, keepdims=True), 0), np.maximum(x.max(-1, keepdims=True), 0)
        candidates = [(hi - lo) / (levels - 1) * f for f in (SEARCH_FACTORS if search else (1.0,))]
        low, high = 0, levels - 1

    def integers(scale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """d (..., block): the integers less the zero point, and the zero point (..., 1)."""
        safe = np.where(scale == 0, 1, scale)
        d = np.rint(x / safe)
        if symmetric:
            return np.clip(d, low, high, out=d), np.full(scale.shape, half, np.float32)
        zero = np.clip(np.rint(-lo / safe), 0, levels - 1)
        d += zero
        np.clip(d, low, high, out=d)
        return np.subtract(d, zero, out=d), zero

    def fitted(d: np.ndarray) -> np.ndarray:
        """The least-squares scale of integers d (..., 1)."""
        norm = _dots(d if w is None else w * d, d)
        return np.where(norm > 0, _dots(wx, d) / np.where(norm > 0, norm, 1), 0)

    if len(candidates) > 1:
        scale = np.choose(_best_candidate(x, w, wx, bits, candidates, integers), candidates)
    else:
        scale = candidates[0]
    d, zero = integers(scale)
    if search:
        scale = fitted(d)
    return ((d + zero).astype(np.int32), scale[..., 0].astype(np.float32),
            zero[..., 0].astype(np.int32))


def _dots(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Block-wise <a, b>: (..., block) x (..., block) -> (..., 1)."""
    return np.matmul(a[..., None, :], b[..., :, None])[..., 0]


def _best_candidate(x: np.ndarray, w: np.ndarray | None, wx: np.ndarray, bits: int,
                    candidates: list[np.ndarray],
                    integers: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """(..., 1) int8: the index of each block's candidate scale of least (weighted) error, each
    candidate's ``integers`` refitted with the least-squares scale (the first on ties)."""
    best = np.zeros((*x.shape[:-1], 1), np.int8)
    best_error = None
    for i, scale in enumerate(candidates):
        d, _ = integers(scale)
        wd = d if w is None else w * d
        norm, dot = _dots(wd, d), _dots(wx, d)
        if bits == 4:  # error = <w x, x> - dot^2 / norm: the constant left out
            error = -np.where(norm > 0, dot * dot / np.where(norm > 0, norm, 1), 0)
        else:  # 8 bits err by 1/65536 of <w x, x>, below float32's rounding of that form
            d *= np.where(norm > 0, dot / np.where(norm > 0, norm, 1), 0)
            residual = np.subtract(x, d, out=d)
            error = _dots(residual if w is None else np.multiply(w, residual, out=wd), residual)
        if best_error is None:
            best_error = error
        else:
            better = error < best_error
            best_error = np.where(better, error, best_error)
            best[better] = i
    return best


def _numpy_rows(rows: np.ndarray, block_size: int, symmetric: bool, bits: int,
                rounding: str, importance: np.ndarray | None = None) -> QuantizedRows:
    """:func:`quantize_rows` in numpy, chunk by chunk of rows."""
    n, k = rows.shape
    blocks = (k + block_size - 1) // block_size
    weights = None
    if importance is not None and rounding == "search":
        weights = np.ones(blocks * block_size, np.float32)  # padding columns: zeros, any weight
        weights[:k] = importance
        weights = weights.reshape(1, blocks, block_size)
    width = block_size // 2 if bits == 4 else block_size
    packed = np.zeros((n, blocks, width), dtype=np.uint8)
    scales = np.zeros((n, blocks), dtype=np.float32)
    zeros = np.zeros((n, blocks), dtype=np.int32)

    def chunk(start: int) -> None:
        stop = min(n, start + rows_per_chunk)
        padded = np.zeros((stop - start, blocks * block_size), np.float32)  # K padded with zeros
        padded[:, :k] = rows[start:stop]
        q, scales[start:stop], zeros[start:stop] = search_blocks(
            padded.reshape(stop - start, blocks, block_size), bits, symmetric, rounding == "search", weights)
        q = q.astype(np.uint8)
        packed[start:stop] = (q[..., 0::2] | (q[..., 1::2] << 4)) if bits == 4 else q

    # chunks of about SEARCH_CHUNK weights, on every core (numpy lets go of the GIL in its loops)
    rows_per_chunk = max(1, min(CHUNK_ROWS, SEARCH_CHUNK // max(k, 1)))
    starts = range(0, n, rows_per_chunk)
    if len(starts) == 1:
        chunk(0)
    else:
        with ThreadPoolExecutor(_workers()) as pool:
            list(pool.map(chunk, starts))
    zero_points = None
    if not symmetric:
        padded = np.zeros((n, blocks + blocks % 2), np.uint8)
        padded[:, :blocks] = zeros
        zero_points = padded[:, 0::2] | (padded[:, 1::2] << 4)
    return QuantizedRows(packed, scales, zero_points, block_size, k, bits=bits)


def dequantize_rows(q: QuantizedRows) -> np.ndarray:
    """The float32 (N, K) matrix the blocks stand for (for the reports' quantization error)."""
    n, blocks, _ = q.packed.shape
    nibbles = (q.packed if q.bits == 8 else
               np.stack([q.packed & 0x0F, q.packed >> 4], axis=-1)).reshape(n, blocks, q.block_size)
    if q.zero_points is None:
        zero = np.full((n, blocks, 1), 2.0 ** (q.bits - 1), np.float32)
    else:
        pairs = np.stack([q.zero_points & 0x0F, q.zero_points >> 4], axis=-1).reshape(n, -1)
        zero = pairs[:, :blocks, None].astype(np.float32)
    values = (nibbles.astype(np.float32) - zero) * q.scales[..., None]
    if q.offsets is not None:
        values += q.offsets[..., None]
    return values.reshape(n, blocks * q.block_size)[:, :q.k]



def _constant(values: list[int], name: str) -> ir.Node:
    return ir.node("Constant", [], {"value": ir.tensor(np.array(values, np.int64))}, name=name)


def _rank(value: ir.Value, name: str) -> int:
    rank = value.shape.rank() if value.shape is not None else None
    if rank is None:
        raise ExportError(f"{name}: weights with block offsets (a GGUF file's mins) need the "
                          "input's rank, which the graph left unknown. Export with "
                          "quantize='int4' from float weights instead, or report this graph.")
    return rank


def offset_nodes(x: ir.Value, product: ir.Value, offsets: ir.Value, k: int, block_size: int,
                 name: str) -> list[ir.Node]:
    """Nodes adding the blocks' offsets to ``product`` = MatMulNBits(x) (..., N):
    ``product + (block sums of x) @ offsets.T``, x (..., K) of known rank, ``offsets``
    (N, K / block_size) float32. The last node's output is the sum."""
    rank = _rank(x, name)
    shape = _constant([0] * (rank - 1) + [k // block_size, block_size], f"{name}_shape")
    axes = _constant([-1], f"{name}_axes")
    blocks = ir.node("Reshape", [x, shape.outputs[0]], name=f"{name}_blocks")
    sums = ir.node("ReduceSum", [blocks.outputs[0], axes.outputs[0]], {"keepdims": 0},
                   name=f"{name}_sums")
    correction = ir.node("FusedMatMul", [sums.outputs[0], offsets],
                         {"transA": 0, "transB": 1, "alpha": 1.0}, domain="com.microsoft",
                         name=f"{name}_offsets")
    total = ir.node("Add", [product, correction.outputs[0]], name=f"{name}_total")
    return [shape, axes, blocks, sums, correction, total]


def gather_offset_nodes(ids: ir.Value, rows: ir.Value, offsets: ir.Value, k: int, block_size: int,
                        name: str) -> list[ir.Node]:
    """Nodes adding the blocks' offsets to ``rows`` = GatherBlockQuantized(table, ids)
    (..., K): each gathered row's (K / block_size) offsets, ``offsets`` (N, K / block_size),
    repeated over its blocks. The last node's output is the sum."""
    rank = _rank(ids, name)
    axes = _constant([-1], f"{name}_axes")
    blocked = _constant([0] * rank + [k // block_size, block_size], f"{name}_blocked")
    flat = _constant([0] * rank + [k], f"{name}_flat")
    gathered = ir.node("Gather", [offsets, ids], {"axis": 0}, name=f"{name}_offsets")
    column = ir.node("Unsqueeze", [gathered.outputs[0], axes.outputs[0]], name=f"{name}_column")
    blocks = ir.node("Reshape", [rows, blocked.outputs[0]], name=f"{name}_blocks")
    added = ir.node("Add", [blocks.outputs[0], column.outputs[0]], name=f"{name}_added")
    total = ir.node("Reshape", [added.outputs[0], flat.outputs[0]], name=f"{name}_total")
    return [axes, blocked, flat, gathered, column, blocks, added, total]
