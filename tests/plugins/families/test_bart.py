"""The bart family: BartForConditionalGeneration checkpoints equal transformers in PyTorch and
onnxruntime, greedy and beam search included (with and without a forced first token)."""

from __future__ import annotations

from typing import ClassVar

import pytest
import torch
import transformers as hf

import transformer_kit as tk
from tests.plugins.families import parity


def _bart(d_model, heads, enc, dec, forced_bos=None, **extra):
    """A random BART; ``forced_bos`` goes where transformers saves it, generation_config.json
    (released checkpoints also carry it in config.json)."""
    model = hf.BartForConditionalGeneration(hf.BartConfig(
        vocab_size=parity.VOCAB, d_model=d_model, encoder_attention_heads=heads,
        decoder_attention_heads=heads, encoder_layers=enc, decoder_layers=dec,
        encoder_ffn_dim=2 * d_model, decoder_ffn_dim=2 * d_model, max_position_embeddings=40,
        pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
        init_std=0.2, **extra))  # a wider init than BART's 0.02, so greedy tokens vary
    with torch.no_grad():
        model.final_logits_bias.normal_(std=0.05)  # zero at init; make its mapping count
        model.final_logits_bias[0, 2] -= 1.0  # a random BART often ends at once: make rows run on
    model.generation_config.forced_bos_token_id = forced_bos
    return model


class TestBart(parity.FamilyParity):
    CHECKPOINTS: ClassVar = {
        "bart-4heads-2+1layers-gelu": lambda: _bart(16, 4, 2, 1),
        "bart-3heads-1+2layers-relu-scaled-forced-bos": lambda: _bart(
            12, 3, 1, 2, activation_function="relu", scale_embedding=True, forced_bos=0),
    }


def test_the_forced_first_token_comes_from_the_config_and_options_override_it(tmp_path):
    _bart(12, 3, 1, 1, forced_bos=0).save_pretrained(tmp_path)
    model = tk.from_hf(tmp_path)
    assert model.config.forced_bos_id == 0
    assert model.config.positional.params == {"offset": 2} and model.config.embedding_norm
    ids = torch.randint(3, parity.VOCAB, (2, 5), generator=torch.Generator().manual_seed(0))
    assert (model.generate(ids, max_new_tokens=3)[:, 0] == 0).all()
    assert (model.generate(ids, max_new_tokens=3, forced_bos_id=7)[:, 0] == 7).all()


def test_mbart_s_final_layer_norm_is_refused_naming_the_field(tmp_path):
    config = hf.BartConfig(vocab_size=parity.VOCAB, d_model=8, encoder_attention_heads=2,
                           decoder_attention_heads=2, encoder_layers=1, decoder_layers=1,
                           encoder_ffn_dim=8, decoder_ffn_dim=8, add_final_layer_norm=True)
    hf.BartForConditionalGeneration(config).save_pretrained(tmp_path)
    with pytest.raises(tk.CheckpointError, match="bart checkpoint with add_final_layer_norm"):
        tk.from_hf(tmp_path)
