"""MXFP4 tensors (the OCP microscaling format gpt-oss's Hub checkpoints store their experts in)
read as float32.

A tensor of rows of K values is stored as two: ``{name}_blocks`` (..., rows, K / 32, 16)
uint8, two FP4 E2M1 codes per byte (the low nibble is the even value, the high nibble the odd
one), and ``{name}_scales`` (..., rows, K / 32) uint8, one E8M0 exponent per block of 32
values (2 ** (scale - 127)). A code's value is ``FP4_VALUES[code]``, so a value is
``FP4_VALUES[code] * 2 ** (scale - 127)``: exact in float32 (an E2M1 value has two
significant bits; ``ldexp`` only moves the exponent) for every scale but the top two, which
overflow as they do in transformers; so the kit's weights are bit for bit transformers'
``convert_moe_packed_tensors`` in float32.

The dequantization is recorded on deferred tensors like any other torch call (it runs when
the mapping's result is read, one tensor at a time).
"""

from __future__ import annotations

import torch
from torch import Tensor

from transformer_kit.checkpoints.deferred import DeferredTensor
from transformer_kit.core.errors import CheckpointError

#: The 16 FP4 E2M1 codes' values: 0-7 positive, 8-15 their negatives (the sign bit is 8).
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
              -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
#: Values per scale (an MXFP4 block).
BLOCK = 32


def _dequantize(blocks: Tensor, scales: Tensor) -> Tensor:
    """blocks (..., rows, groups, 16) uint8, scales (..., rows, groups) uint8 -> (..., rows,
    groups * 32) float32."""
    lut = torch.tensor(FP4_VALUES, dtype=torch.float32)
    values = torch.stack([lut[(blocks & 0x0F).long()], lut[(blocks >> 4).long()]], dim=-1)
    values = values.reshape(*blocks.shape[:-1], BLOCK)  # (..., rows, groups, 32), low nibble first
    values = torch.ldexp(values, (scales.to(torch.int32) - 127)[..., None])
    return values.reshape(*blocks.shape[:-2], -1)


def check_mxfp4(blocks: Tensor, scales: Tensor, name: str) -> None:
    """Refuses (CheckpointError naming ``name``) blocks and scales that are not MXFP4's uint8
    (..., rows, groups, 16) and (..., rows, groups); reads nothing."""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise CheckpointError(f"{name}: MXFP4 blocks and scales must be uint8; got {blocks.dtype} "
                              f"and {scales.dtype}. The checkpoint is not an MXFP4 one as written.")
    if blocks.dim() < 2 or blocks.shape[-1] != BLOCK // 2 or tuple(blocks.shape[:-1]) != tuple(scales.shape):
        raise CheckpointError(f"{name}: MXFP4 blocks {tuple(blocks.shape)} must be the scales' shape "
                              f"{tuple(scales.shape)} plus 16 bytes (32 values per scale).")


def dequantize_mxfp4(blocks: Tensor, scales: Tensor, name: str = "an MXFP4 tensor") -> Tensor:
    """The float32 values (..., rows, groups * 32) of MXFP4 ``blocks`` (..., rows, groups, 16)
    and ``scales`` (..., rows, groups), both uint8; deferred (read when materialized) when
    ``blocks`` is. ``name`` names the tensor in the refusal of mismatched shapes or dtypes."""
    check_mxfp4(blocks, scales, name)
    if not isinstance(blocks, DeferredTensor) and not isinstance(scales, DeferredTensor):
        return _dequantize(blocks, scales)
    meta = torch.empty((*blocks.shape[:-2], blocks.shape[-2] * BLOCK), dtype=torch.float32, device="meta")
    return DeferredTensor(meta, ("call", _dequantize, (blocks, scales), {}))

