"""ONNX translations of :mod:`transformer_kit.fused_ops`: the opset-23 ``Attention`` op on
(batch, len, heads * head_dim) inputs, with the key/value cache concatenated inside it."""

from __future__ import annotations

import torch
from onnxscript import opset23 as op

import transformer_kit.fused_ops  # noqa: F401  (defines the torch.ops.transformer_kit ops)

#: The first opset whose Attention op these translations use.
PACKED_ATTENTION_OPSET = 23


def packed_attention_onnx(q, k, v, mask, num_heads: int, kv_heads: int, scale: float):
    out, _, _, _ = op.Attention(q, k, v, mask, q_num_heads=num_heads, kv_num_heads=kv_heads,
                                scale=scale)
    return out


def packed_cached_attention_onnx(q, k, v, mask, past_key, past_value, num_heads: int,
                                 kv_heads: int, scale: float):
    out, present_key, present_value, _ = op.Attention(
        q, k, v, mask, past_key, past_value, q_num_heads=num_heads, kv_num_heads=kv_heads,
        scale=scale)
    return out, present_key, present_value


def builtin_translations() -> dict:
    return {
        torch.ops.transformer_kit.packed_attention.default: packed_attention_onnx,
        torch.ops.transformer_kit.packed_cached_attention.default: packed_cached_attention_onnx,
    }
