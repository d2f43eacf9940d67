"""A mixture of experts' weights in 4- or 8-bit blocks: onnxruntime's ``QMoE`` in place of the
``MoE`` node of a quantized export.

``moe_onnx`` writes each sparse layer as one ``com.microsoft`` ``MoE`` node over the stacked
experts: fc1 (E, 2I, H), each expert's gate and up rows interleaved, and fc2 (E, H, I). With
``quantize="int4"`` (an :class:`Int4`) or ``"int8"``, the weight writer replaces it by ``QMoE``
over the same experts, quantized expert by expert (one expert's float rows in memory at a time)
in blocks along K (H for fc1, I for fc2):

- int4: :class:`Int4`'s block size, rounding (each expert's error weighed by the mean square of
  the inputs routed to it over the calibration text), zero points and accuracy level (4: int8
  activations, onnxruntime's fastest CPU kernel; 1: float32 activations). The experts of the
  layers ``Int4.eight_bit``'s ``"early"`` names are in 8 bits. QMoE reads fc1 and fc2 in one
  width (onnxruntime 1.31's CPU kernel: "Mixed-width QMoE execution is not yet implemented"),
  so ``"down"`` does not reach the experts' fc2.
- int8: 8-bit symmetric blocks of 32 (16 where 32 does not divide H and I; a scale per row where
  neither does), the analogue of int8's dynamic products: onnxruntime's blocked 8-bit experts
  quantize their activations to int8 on every call, as ``MatMulInteger`` does.

Where H or I is not a multiple of any block of 16 or more, 4-bit experts stay float (``MoE``):
QMoE's blocks must divide both, and one scale per row of 4 bits loses far more than the
blocks of the rest of the model. ``QMoE`` routes by the top-k of its router input, then a
softmax over those k: the renormalised weights of ``MoE``'s ``normalize_routing_weights=1``. A
router without renormalisation (Qwen2-MoE, OLMoE) gives ``QMoE`` the softmax over all experts
as its ``router_weights`` (input 14), whose chosen values mix the outputs as they are.

A GGUF model's experts (``model.gguf_blocks``, ``gguf_blocks.py``) are written from the file's
own blocks where ``QMoE`` holds them exactly: every expert's gate, up and down in ``Q4_0`` (4-bit
blocks of 32, ``d (q - 8)``) or every one in ``Q8_0`` (8-bit blocks of 32); fc1's gate and up rows
interleave whole rows, so their blocks are unchanged. Types with a per-block offset (``Q4_1``,
``Q4_K``: ``QMoE`` has integer zero points only) or a mix of widths are quantized here from their
dequantized values, and the export's report says which and why.

Layouts (onnxruntime's ``QMoE`` schema): packed weights uint8 (E, N, K * bits / 8), two 4-bit
values per byte along K, the even one in the low nibble; scales (E, N, K / block_size) (or (E,
N) without blocks); zero points (E, N, ceil(K / block_size * bits / 8)), packed along the blocks
the same way; absent: 8 (4 bits) or 128 (8 bits).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from transformer_kit.export.int4_nodes import QuantizedRows, quantize_rows
from transformer_kit.export.quantize import Int4
from transformer_kit.export.weight_exprs import Expr

#: MoE's inputs that are weights: fc1, fc1 bias, fc2, fc2 bias (fc3 is never written).
MOE_FC1, MOE_FC1_BIAS, MOE_FC2, MOE_FC2_BIAS = 2, 3, 4, 5
#: Block sizes tried, from the preferred one down (QMoE's least is 16).
_SMALLEST_BLOCK = 16


@dataclass(frozen=True)
class ExpertBits:
    """How a quantized export writes experts: ``bits`` (4 or 8), ``block_size`` (the preferred
    block; smaller ones where it does not divide H and I), ``rounding``, ``symmetric``,
    ``accuracy_level`` (0: the kernel's default), and ``early_in_8_bits`` (the experts of a stack's
    first eighth of layers in 8 bits)."""

    bits: int
    block_size: int
    rounding: str = "nearest"
    symmetric: bool = True
    accuracy_level: int = 0
    early_in_8_bits: bool = False

    def block_for(self, widths: tuple[int, ...], bits: int) -> int | None:
        """The block for experts whose products read ``widths`` (H, I): the preferred block or
        the largest power of two of at least 16 below it that divides every width; 0 (a scale
        per row) in 8 bits when none does; None in 4 bits (the experts stay float)."""
        block = self.block_size
        while block >= _SMALLEST_BLOCK:
            if all(w % block == 0 for w in widths):
                return block
            block //= 2
        return 0 if bits == 8 else None


def expert_bits(quantize: str | Int4 | None) -> ExpertBits | None:
    """How ``export_onnx``'s ``quantize`` writes experts (None: float, as ``MoE``)."""
    if isinstance(quantize, Int4):
        return ExpertBits(4, quantize.block_size, quantize.rounding, quantize.symmetric,
                          quantize.accuracy_level, "early" in quantize.eight_bit)
    if quantize == "int8":
        return ExpertBits(8, 32)
    return None


def expert_parts(expr: Expr) -> list[Expr] | None:
    """The per-expert expressions of a stacked experts' weight ``expr`` (a Reshape to (E, N, K)
    of E parts concatenated along their first axis, as ``moe_onnx`` writes them), or None when
    ``expr`` is not such a stack."""
    if expr[0] != "reshape" or len(expr[2]) != 3:
        return None
    inner, experts = expr[1], expr[2][0]
    if inner[0] == "concat" and inner[2] == 0 and len(inner[1]) == experts:
        return list(inner[1])
    return [inner] if experts == 1 else None


@dataclass
class StackedBlocks:
    """Every expert's (N, K) rows in blocks, stacked as ``QMoE`` reads them."""

    packed: np.ndarray  # (E, N, K * bits / 8) uint8
    scales: np.ndarray  # (E, N, K / block_size), or (E, N) without blocks; float32
    zero_points: np.ndarray | None  # (E, N, ceil(K / block_size * bits / 8)) uint8, or None
    bits: int
    block_size: int  # 0: a scale per row


def stack_experts(rows: list[QuantizedRows], per_row: bool = False) -> StackedBlocks:
    """Every expert's rows in blocks (one layout) stacked as ``QMoE`` reads them; ``per_row``:
    one block per row (no ``block_size`` attribute, scales (E, N))."""
    first = rows[0]
    packed = np.stack([q.packed.reshape(q.packed.shape[0], -1) for q in rows])  # (E, N, K * bits / 8)
    scales = np.stack([q.scales[:, 0] if per_row else q.scales for q in rows])
    zero_points = np.stack([q.zero_points for q in rows]) if first.zero_points is not None else None
    return StackedBlocks(packed, scales, zero_points, first.bits, 0 if per_row else first.block_size)


def quantize_experts(parts: list[Expr], evaluate: Callable[[Expr], np.ndarray], k: int, bits: int,
                     block_size: int, spec: ExpertBits,
                     importance: Callable[[Expr, int], np.ndarray | None]) -> StackedBlocks:
    """Each expert's rows (``evaluate(part)`` reshaped to (N, ``k``)) quantized in blocks of
    ``block_size`` (0: one block per row, K wide), one expert at a time, and stacked;
    ``importance(part, k)`` weighs its columns' errors (None: alike)."""
    quantized = []
    for part in parts:
        rows = np.asarray(evaluate(part), dtype=np.float32).reshape(-1, k)
        quantized.append(quantize_rows(rows, block_size or k, spec.symmetric or bits == 8, bits=bits,
                                       rounding=spec.rounding, importance=importance(part, k)))
    return stack_experts(quantized, per_row=not block_size)


def _interleaved(gate: QuantizedRows, up: QuantizedRows) -> QuantizedRows:
    """fc1's rows of one expert from its gate's and up's: row 2i gate's row i, 2i + 1 up's."""
    def pair(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.stack([a, b], axis=1).reshape(2 * a.shape[0], *a.shape[1:])
    return QuantizedRows(pair(gate.packed, up.packed), pair(gate.scales, up.scales), None,
                         gate.block_size, gate.k, bits=gate.bits)


def _part_rows(part: Expr, file_rows: Callable[[Expr], QuantizedRows | None]) -> QuantizedRows | None:
    """One expert's fc1 (its gate and up side by side: ``concat`` on axis 1, read row-interleaved)
    or fc2 (a weight) from a GGUF file's blocks, or None."""
    if part[0] == "weight":
        return file_rows(part)
    if part[0] == "concat" and part[2] == 1 and len(part[1]) == 2:
        gate, up = (file_rows(p) for p in part[1])
        if gate is not None and up is not None and (gate.bits, gate.block_size) == (up.bits, up.block_size):
            return _interleaved(gate, up)
    return None


def file_experts(fc1: list[Expr], fc2: list[Expr], file_rows: Callable[[Expr], QuantizedRows | None],
                 ) -> tuple[StackedBlocks, StackedBlocks] | None:
    """fc1 and fc2 of every expert from a GGUF file's own blocks, when ``QMoE`` holds them
    exactly (all in one width, one block, no offsets), else None."""
    rows = [_part_rows(part, file_rows) for part in fc1 + fc2]
    if any(q is None or q.offsets is not None for q in rows):
        return None
    if len({(q.bits, q.block_size) for q in rows}) != 1:
        return None
    return stack_experts(rows[:len(fc1)]), stack_experts(rows[len(fc1):])


def qmoe_attributes(moe_attributes: dict, bits: int, block_size: int, spec: ExpertBits) -> dict:
    """QMoE's attributes: MoE's (k, activation, SwiGLU's form, ``normalize_routing_weights``:
    without renormalisation, the node is also given ``router_weights``) with the experts' width,
    block and accuracy level."""
    attributes = {name: value for name, value in moe_attributes.items() if name != "use_sparse_mixer"}
    attributes["expert_weight_bits"] = bits
    if block_size:
        attributes["block_size"] = block_size
    if spec.accuracy_level and bits == 4:
        attributes["accuracy_level"] = spec.accuracy_level
    return attributes
