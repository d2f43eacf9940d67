"""A GGUF file's own quantized blocks as ``MatMulNBits`` weights, bit for bit, not quantized again.

Each mapped type becomes a :class:`QuantizedRows` whose dequantized value is the GGUF's,
``w = (q - 2**(bits-1)) * scale + offset`` per block, with the GGUF's integers q unchanged
(nibbles only reordered) and no zero points stored (onnxruntime's default, 8 or 128):

=======  ====  =====  ====================================  ===============================
type     bits  block  scale                                 offset
=======  ====  =====  ====================================  ===============================
Q4_0     4     32     d                                     none (w = d (q - 8))
Q4_1     4     32     d                                     m + 8 d
Q4_K     4     32     d sc (6-bit sub-block scale)          8 d sc - dmin m
Q5_0     8     32     d   (q stored as q + 112)             none (w = d (q - 16))
Q5_1     8     32     d   (q stored as q + 112)             m + 16 d
Q8_0     8     32     d   (q stored as q + 128)             none
Q6_K     8     16     d sc (int8 sub-block scale)           none (q stored as q + 96)
=======  ====  =====  ====================================  ===============================

Why offsets and not float zero points: onnxruntime 1.31's CPU ``MatMulNBits`` accepts float
zero points for 4 bits only, and then dequantizes the whole matrix to float32 on every call;
for 8 bits it refuses them
("Only 2b and 4b quantization is supported for unpacked compute for now"), and
``GatherBlockQuantized`` takes zero points of the data's integer type only. A block's offset
is instead added as ``(block sums of x) @ offsets.T`` after a symmetric ``MatMulNBits``
(``int4_nodes.offset_nodes``): one small float product, the 4-bit product staying on
onnxruntime's packed kernel. The offsets are computed in float64 from the file's float16
values and rounded once to float32, so the products equal ``x @ dequantize(W).T`` within
float32 rounding.

Not mapped (the export quantizes their dequantized weights with the kit's own int4 and says so
in its report): Q2_K, Q3_K, Q5_K (expressible the same way, not written yet), the IQ types,
and float types (F16, BF16, F32, which have no blocks to real).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from transformer_kit.checkpoints.gguf.blocks import GgufBlocks
from transformer_kit.core.errors import ExportError
from transformer_kit.export.int4_nodes import QuantizedRows, dequantize_rows
from transformer_kit.export.weight_exprs import Expr, name_of

#: Types written in 8 bits: onnxruntime 1.31's CPU MatMulNBits computes 8 bits on its packed
#: kernel only at accuracy_level 4 (int8 activations); below, it dequantizes the whole matrix
#: on every call, so their products are written as float32 MatMuls of the same (exact) values
#: there; their embedding table stays 8 bits.
EIGHT_BITS = ("Q5_0", "Q5_1", "Q8_0", "Q6_K")
#: type name -> (bytes per block, weights per block)
BLOCK_BYTES = {"Q4_0": (18, 32), "Q4_1": (20, 32), "Q5_0": (22, 32), "Q5_1": (24, 32),
               "Q8_0": (34, 32), "Q4_K": (144, 256), "Q6_K": (210, 256)}


def _f16(raw: np.ndarray) -> np.ndarray:
    """(..., 2) uint8 little-endian float16 -> (...) float64."""
    return np.ascontiguousarray(raw).view("<f2")[..., 0].astype(np.float64)


def _pack4(q: np.ndarray) -> np.ndarray:
    """(N, blocks, block) values 0..15 -> (N, blocks, block / 2) bytes, element 2i in the low
    nibble of byte i (MatMulNBits' order)."""
    return (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)


def _split_nibbles(qs: np.ndarray) -> np.ndarray:
    """(..., 16) bytes of a ggml 32-block -> (..., 32): low nibbles are elements 0..15, high 16..31."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _q4_0(blocks: np.ndarray) -> tuple:
    d = _f16(blocks[..., 0:2])
    return 4, 32, _pack4(_split_nibbles(blocks[..., 2:18])), d, None


def _q4_1(blocks: np.ndarray) -> tuple:
    d, m = _f16(blocks[..., 0:2]), _f16(blocks[..., 2:4])
    return 4, 32, _pack4(_split_nibbles(blocks[..., 4:20])), d, m + 8 * d


def _q5(blocks: np.ndarray, start: int) -> np.ndarray:
    """The 5-bit values (..., 32) of Q5_0 / Q5_1 blocks whose qh starts at byte ``start``."""
    high = np.ascontiguousarray(blocks[..., start:start + 4]).view("<u4")[..., 0]
    bits = (high[..., None] >> np.arange(32, dtype=np.uint32)) & 1
    return _split_nibbles(blocks[..., start + 4:start + 20]) | (bits.astype(np.uint8) << 4)


def _q5_0(blocks: np.ndarray) -> tuple:
    return 8, 32, _q5(blocks, 2) + np.uint8(112), _f16(blocks[..., 0:2]), None


def _q5_1(blocks: np.ndarray) -> tuple:
    d, m = _f16(blocks[..., 0:2]), _f16(blocks[..., 2:4])
    return 8, 32, _q5(blocks, 4) + np.uint8(112), d, m + 16 * d


def _q8_0(blocks: np.ndarray) -> tuple:
    q = blocks[..., 2:34].view(np.int8).astype(np.int16) + 128
    return 8, 32, q.astype(np.uint8), _f16(blocks[..., 0:2]), None


def _q4_k(blocks: np.ndarray) -> tuple:
    """Super-blocks of 256: d, dmin, 12 bytes of eight 6-bit (scale, min) pairs, 128 bytes of
    nibbles (each 32 bytes: sub-block 2c in the low nibbles, 2c + 1 in the high ones)."""
    n, supers, _ = blocks.shape
    d, dmin = _f16(blocks[..., 0:2]), _f16(blocks[..., 2:4])
    s = blocks[..., 4:16].astype(np.uint8)
    low = np.concatenate([s[..., 0:4] & 63, (s[..., 8:12] & 0x0F) | ((s[..., 0:4] >> 6) << 4)], -1)
    mins = np.concatenate([s[..., 4:8] & 63, (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)], -1)
    qs = blocks[..., 16:144].reshape(n, supers, 4, 32)
    q = np.stack([qs & 0x0F, qs >> 4], axis=3).reshape(n, supers * 8, 32)
    scale = (d[..., None] * low).reshape(n, -1)
    offset = (8 * d[..., None] * low - dmin[..., None] * mins).reshape(n, -1)
    return 4, 32, _pack4(q), scale, offset


def _q6_k(blocks: np.ndarray) -> tuple:
    """Super-blocks of 256: 128 bytes of low nibbles, 64 of high 2-bit pairs, 16 int8 scales
    (one per 16 weights), d; w = d sc (q - 32)."""
    n, supers, _ = blocks.shape
    ql = blocks[..., 0:128].reshape(n, supers, 2, 64)
    qh = blocks[..., 128:192].reshape(n, supers, 2, 1, 32)
    sc = blocks[..., 192:208].view(np.int8).astype(np.float64)
    d = _f16(blocks[..., 208:210])
    low = np.stack([ql[..., :32] & 0x0F, ql[..., 32:] & 0x0F, ql[..., :32] >> 4, ql[..., 32:] >> 4], 3)
    high = (qh >> (2 * np.arange(4, dtype=np.uint8)[:, None])) & 3  # (n, supers, 2, 4, 32)
    q = (low | (high << 4)).reshape(n, supers * 16, 16) + np.uint8(96)
    return 8, 16, q, (d[..., None] * sc).reshape(n, -1), None


MAPPERS: dict[str, Callable[[np.ndarray], tuple]] = {
    "Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0, "Q5_1": _q5_1, "Q8_0": _q8_0,
    "Q4_K": _q4_k, "Q6_K": _q6_k}


def mappable(blocks: GgufBlocks) -> bool:
    """Whether :func:`gguf_rows` writes ``blocks`` exactly."""
    return blocks.type_name in MAPPERS


def gguf_rows(blocks: GgufBlocks) -> QuantizedRows:
    """``blocks`` (a (N, K) matrix in the GGUF's blocks) as MatMulNBits rows with the same values.

    Returns: packed (N, K / block, block / 2) for 4 bits or (N, K / block, block) for 8,
    scales (N, K / block) float32, offsets (N, K / block) float32 or None, no zero points.
    Raises :class:`ExportError` for a type not in :data:`MAPPERS` or bytes of the wrong size.
    """
    if blocks.type_name not in MAPPERS:
        raise ExportError(f"GGUF type {blocks.type_name} has no exact MatMulNBits layout here; "
                          f"the mapped types are {', '.join(MAPPERS)}. Quantize its dequantized "
                          "weights instead (the exporter does).")
    n, k = blocks.shape
    size, per_block = BLOCK_BYTES[blocks.type_name]
    data = np.asarray(blocks.data, dtype=np.uint8)
    if data.shape != (n, k // per_block * size) or k % per_block:
        raise ExportError(f"GGUF {blocks.type_name} blocks of shape {data.shape} cannot hold a "
                          f"({n}, {k}) matrix: expected ({n}, {k // per_block * size}) bytes and "
                          f"K a multiple of {per_block}.")
    bits, block, packed, scales, offsets = MAPPERS[blocks.type_name](data.reshape(n, -1, size))
    packed = packed.reshape(n, k // block, -1)
    return QuantizedRows(packed, scales.reshape(n, -1).astype(np.float32), None, block, k, bits=bits,
                         offsets=None if offsets is None else offsets.reshape(n, -1).astype(np.float32))


def stacked(parts: list[QuantizedRows]) -> QuantizedRows | None:
    """Row blocks of one layout (same bits, block and K) stacked into one matrix, or None when
    they differ (q, k and v of other types)."""
    first = parts[0]
    if any((p.bits, p.block_size, p.k) != (first.bits, first.block_size, first.k) for p in parts):
        return None
    offsets = None
    if any(p.offsets is not None for p in parts):
        offsets = np.concatenate([p.offsets if p.offsets is not None else np.zeros_like(p.scales)
                                  for p in parts])
    return QuantizedRows(np.concatenate([p.packed for p in parts]),
                         np.concatenate([p.scales for p in parts]), None, first.block_size, first.k,
                         bits=first.bits, offsets=offsets)


def _row_names(rows: Expr) -> list[str] | None:
    """The parameters whose rows ``rows`` stacks (a weight, or a concatenation of weights along
    rows as the packed q/k/v and gate/up products read them), or None for anything else."""
    if rows[0] == "weight":
        return [rows[1]]
    if rows[0] == "concat" and rows[2] == 0 and all(part[0] == "weight" for part in rows[1]):
        return [part[1] for part in rows[1]]
    return None


class FileBlocks:
    """The GGUF blocks of a model's weights (``model.gguf_blocks``, by parameter name; a tied
    weight under any of its names), as the int4 weight writer asks for them: by the rows
    expression of a product or an embedding table. ``origins`` says, for each rows expression
    asked for, whether the file's blocks were written or the weights were quantized, and why."""

    def __init__(self, model: torch.nn.Module) -> None:
        given: dict[str, GgufBlocks] = dict(getattr(model, "gguf_blocks", None) or {})
        parameters = dict(model.named_parameters(remove_duplicate=False))
        unknown = sorted(set(given) - set(parameters))
        if unknown:
            raise ExportError(f"model.gguf_blocks names {', '.join(unknown[:3])}, which the model has "
                              "no parameter of; key it by the model's parameter names "
                              "(model.named_parameters()).")
        self.blocks: dict[str, GgufBlocks] = {}
        for name, blocks in given.items():
            if tuple(blocks.shape) != tuple(parameters[name].shape):
                raise ExportError(f"model.gguf_blocks[{name!r}] stands for a {tuple(blocks.shape)} "
                                  f"matrix but the parameter is {tuple(parameters[name].shape)}.")
            for alias, p in parameters.items():  # a tied weight is read under any of its names
                if p is parameters[name]:
                    self.blocks[alias] = blocks
        self.origins: dict[str, str] = {}

    def __bool__(self) -> bool:
        return bool(self.blocks)

    def rows(self, rows: Expr, floats: Callable[[], np.ndarray]) -> QuantizedRows | None:
        """The file's blocks of ``rows`` (N, K), or None when the writer should quantize
        ``floats()`` itself (recorded in ``origins`` with the reason)."""
        name, names = name_of(rows), _row_names(rows) or []
        found = [self.blocks[n] for n in names if n in self.blocks]
        if not found:
            self.origins[name] = "quantized here (no GGUF blocks)"
            return None
        types = sorted({b.type_name for b in found})
        unmapped = sorted({b.type_name for b in found if not mappable(b)})
        if len(found) < len(names) or unmapped:
            reason = (f"GGUF {', '.join(unmapped)} has no exact MatMulNBits layout" if unmapped
                      else "some of its parts have no GGUF blocks")
            self.origins[name] = f"quantized here ({reason})"
            return None
        q = stacked([gguf_rows(b) for b in found])
        if q is None:
            self.origins[name] = f"quantized here (its parts' GGUF types {', '.join(types)} differ in layout)"
            return None
        weights = np.asarray(floats(), dtype=np.float32)
        if np.abs(dequantize_rows(q) - weights).max() > 1e-6 * max(float(np.abs(weights).max()), 1e-30):
            self.origins[name] = ("quantized here (the model's weights are not the GGUF blocks' "
                                  "values: changed after loading)")
            return None
        self.origins[name] = f"GGUF {'+'.join(types)} blocks"
        return q

    def float_product(self, rows: Expr, accuracy_level: int, floats: Callable[[], np.ndarray]) -> bool:
        """Whether the product by ``rows`` is written as a float32 MatMul of the file's values
        (8-bit types below accuracy_level 4, see :data:`EIGHT_BITS`): when the file's blocks of
        ``rows`` are 8 bits and the model holds their values."""
        names = _row_names(rows) or []
        if (accuracy_level == 4 or not names or any(n not in self.blocks for n in names)
                or any(self.blocks[n].type_name not in EIGHT_BITS for n in names)
                or self.rows(rows, floats) is None):
            return False
        types = "+".join(sorted({self.blocks[n].type_name for n in names}))
        self.origins[name_of(rows)] = (f"GGUF {types} values in float32 (8-bit MatMulNBits below "
                                       "accuracy_level 4 dequantizes the matrix every call)")
        return True
