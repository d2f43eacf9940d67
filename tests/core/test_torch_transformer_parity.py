"""The paper's encoder-decoder equals torch.nn.Transformer with the same weights."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

import transformer_kit as tk

D_MODEL, HEADS, D_FF = 32, 4, 64


def _copy_attention(ours, theirs: nn.MultiheadAttention) -> None:
    theirs.in_proj_weight.copy_(torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight]))
    theirs.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))
    theirs.out_proj.weight.copy_(ours.o_proj.weight)
    theirs.out_proj.bias.copy_(ours.o_proj.bias)


def _copy_stack_norm(ours, theirs) -> None:
    if ours.final_norm is None:
        theirs.norm = None  # the paper's post-norm stack has no final norm
    else:
        theirs.norm.load_state_dict(ours.final_norm.state_dict())


def _copy_layer(ours, theirs) -> None:
    _copy_attention(ours.self_attention, theirs.self_attn)
    for name in ("linear1", "linear2"):
        getattr(theirs, name).load_state_dict(getattr(ours.feedforward, name).state_dict())
    norms = [ours.self_norm, ours.cross_norm, ours.ff_norm] if ours.cross_attention else [
        ours.self_norm, ours.ff_norm]
    if ours.cross_attention is not None:
        _copy_attention(ours.cross_attention, theirs.multihead_attn)
    for i, norm in enumerate(norms, start=1):
        getattr(theirs, f"norm{i}").load_state_dict(norm.state_dict())


def _sinusoidal(length: int) -> torch.Tensor:
    position = np.arange(length)[:, None]
    i = np.arange(D_MODEL)[None, :]
    angles = position / np.power(10000, (2 * (i // 2)) / D_MODEL)
    return torch.tensor(np.where(i % 2 == 0, np.sin(angles), np.cos(angles)), dtype=torch.float32)


@pytest.mark.parametrize("kernel", ["matmul", "einsum", "sdpa"])
@pytest.mark.parametrize("block", ["post_norm", "pre_norm"])
@pytest.mark.filterwarnings("ignore:enable_nested_tensor is True")
@torch.no_grad()
def test_encoder_decoder_matches_torch_transformer(kernel, block):
    torch.manual_seed(0)
    model = tk.build_model({
        "architecture": "encoder_decoder", "vocab_size": 40, "d_model": D_MODEL, "num_heads": HEADS,
        "encoder_layers": 2, "decoder_layers": 3, "d_ff": D_FF, "dropout": 0.0,
        "attention": kernel, "positional": "sinusoidal", "block": block,
        "feedforward": "relu", "norm": "layernorm",
    }).eval()
    reference = nn.Transformer(D_MODEL, HEADS, 2, 3, D_FF, dropout=0.0, batch_first=True,
                               norm_first=block == "pre_norm").eval()
    _copy_stack_norm(model.encoder, reference.encoder)
    _copy_stack_norm(model.decoder, reference.decoder)
    for ours, theirs in zip(model.encoder.layers, reference.encoder.layers, strict=True):
        _copy_layer(ours, theirs)
    for ours, theirs in zip(model.decoder.layers, reference.decoder.layers, strict=True):
        _copy_layer(ours, theirs)

    src = torch.randint(3, 40, (3, 7))
    src[1, 4:] = 0  # padding
    src[2, 1:] = 0
    tgt = torch.randint(3, 40, (3, 5))
    embedding = model.src_embed.token.weight
    src_emb = embedding[src] * math.sqrt(D_MODEL) + _sinusoidal(7)
    tgt_emb = embedding[tgt] * math.sqrt(D_MODEL) + _sinusoidal(5)
    pad = src == 0
    previous = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)  # the fast path zeroes padded rows
    try:
        out = reference(src_emb, tgt_emb, tgt_mask=nn.Transformer.generate_square_subsequent_mask(5),
                        src_key_padding_mask=pad, memory_key_padding_mask=pad)
    finally:
        torch.backends.mha.set_fastpath_enabled(previous)
    expected = out @ embedding.T  # tied output projection
    torch.testing.assert_close(model(src, tgt), expected, rtol=1e-5, atol=1e-5)
