"""MXFP4 blocks and scales read as float32: bit for bit transformers' dequantization, refusals
of what is not MXFP4, and a layer's stacked experts read once for all its experts (a
``SharedRead``, as the gpt_oss family reads them)."""

from __future__ import annotations

import pytest
import torch
from transformers.integrations.mxfp4 import convert_moe_packed_tensors

import transformer_kit as tk
from transformer_kit.checkpoints.deferred import DeferredTensor, SharedRead, materialize
from transformer_kit.checkpoints.mxfp4 import dequantize_mxfp4


def _random_mxfp4(experts: int = 3, rows: int = 4, groups: int = 2, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, 256, (experts, rows, groups, 16), generator=gen, dtype=torch.uint8)
    scales = torch.randint(100, 150, (experts, rows, groups), generator=gen, dtype=torch.uint8)
    scales[0, 0, 0] = 1  # 2 ** -126 x 0.5: a subnormal float32, still exact
    return blocks, scales


def test_values_equal_transformers_convert_moe_packed_tensors_bit_for_bit():
    blocks, scales = _random_mxfp4()
    ours = dequantize_mxfp4(blocks, scales)  # (experts, rows, groups * 32)
    theirs = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)  # transposed to (E, K, rows)
    assert ours.dtype == torch.float32 and torch.equal(ours, theirs.transpose(1, 2))
    tiny = ours[0, 0, :32].abs()  # the block of scale 1: values x 2 ** -126, down to subnormals
    assert tiny.max() <= 6 * 2.0 ** -126 and ((tiny > 0) & (tiny < 2.0 ** -126)).any()


def _counted(tensor: torch.Tensor, reads: list[str], name: str) -> DeferredTensor:
    """``tensor`` as a checkpoint's deferred read that records each time it is read."""
    meta = torch.empty(tensor.shape, dtype=tensor.dtype, device="meta")
    return DeferredTensor(meta, ("read", lambda key: reads.append(key) or tensor, name))


def test_a_layer_s_experts_read_its_bytes_once():
    blocks, scales = _random_mxfp4(experts=4)
    reads: list[str] = []
    layer = SharedRead((_counted(blocks, reads, "blocks"), _counted(scales, reads, "scales")), reads=2 * 4)
    experts = [layer.part(lambda b, s, e=e: dequantize_mxfp4(b[e], s[e]), (4, 64)) for e in range(4)]
    assert all(isinstance(x, DeferredTensor) and tuple(x.shape) == (4, 64) for x in experts)
    assert reads == []  # nothing read until materialized
    for e, expert in enumerate(experts):  # gate and up rows of each expert, as the family reads them
        assert torch.equal(materialize(expert[0::2]), dequantize_mxfp4(blocks[e], scales[e])[0::2])
        assert torch.equal(materialize(expert[1::2]), dequantize_mxfp4(blocks[e], scales[e])[1::2])
    assert reads == ["blocks", "scales"]
    materialize(experts[0])  # a read past the expected ones reads the bytes again
    assert reads == ["blocks", "scales"] * 2


@pytest.mark.parametrize(("blocks", "scales", "message"), [
    (torch.zeros(2, 2, 16, dtype=torch.int8), torch.zeros(2, 2, dtype=torch.uint8), r"must be uint8"),
    (torch.zeros(2, 2, 8, dtype=torch.uint8), torch.zeros(2, 2, dtype=torch.uint8), r"plus 16 bytes"),
    (torch.zeros(2, 3, 16, dtype=torch.uint8), torch.zeros(2, 2, dtype=torch.uint8), r"the scales' shape"),
], ids=["dtype", "block bytes", "scales"])
def test_what_is_not_mxfp4_is_refused(blocks, scales, message):
    with pytest.raises(tk.CheckpointError, match=r"layers.0.mlp.experts.down_proj: MXFP4 .*" + message):
        dequantize_mxfp4(blocks, scales, "layers.0.mlp.experts.down_proj")
