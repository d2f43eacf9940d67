"""The marian family: MarianMTModel checkpoints equal transformers in PyTorch and onnxruntime."""

from __future__ import annotations

from typing import ClassVar

import torch
import transformers as hf

from tests.plugins.families import parity


def _marian(d_model, heads, enc, dec, **extra):
    model = hf.MarianMTModel(hf.MarianConfig(
        vocab_size=parity.VOCAB, d_model=d_model, encoder_attention_heads=heads,
        decoder_attention_heads=heads, encoder_layers=enc, decoder_layers=dec,
        encoder_ffn_dim=2 * d_model, decoder_ffn_dim=2 * d_model, max_position_embeddings=64,
        pad_token_id=parity.VOCAB - 1, decoder_start_token_id=parity.VOCAB - 1, eos_token_id=0,
        init_std=0.2, **extra))  # a wider init than Marian's 0.02, so greedy tokens vary
    with torch.no_grad():
        model.final_logits_bias.normal_(std=0.05)  # zero at init; make its mapping count
    return model


class TestMarian(parity.FamilyParity):
    CHECKPOINTS: ClassVar = {
        "marian-3heads-2+1layers-swish": lambda: _marian(12, 3, 2, 1, scale_embedding=True,
                                                         activation_function="swish"),
        "marian-4heads-1+3layers-gelu": lambda: _marian(16, 4, 1, 3, activation_function="gelu"),
    }
