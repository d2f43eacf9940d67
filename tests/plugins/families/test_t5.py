"""The t5 family: T5ForConditionalGeneration checkpoints (T5 v1.0 with ReLU and a rescaled tied
head, v1.1 / Flan-T5 with gated GELU and an untied head) equal transformers in PyTorch and
onnxruntime, with sequences longer than the relative bias's exact buckets and max_distance."""

from __future__ import annotations

import json
from typing import ClassVar

import pytest
import torch
import transformers as hf

import transformer_kit as tk
from tests.plugins.families import parity


def _t5(d_model, heads, enc, dec, d_kv=None, factor=5.0, **extra):
    """A random T5; ``factor``: a wider init than T5's 1.0, so greedy tokens vary (unscaled
    scores grow with it: too wide, and float32 rounding is amplified past 1e-4)."""
    return hf.T5ForConditionalGeneration(hf.T5Config(
        vocab_size=parity.VOCAB, d_model=d_model, d_kv=d_kv or d_model // heads, d_ff=2 * d_model,
        num_layers=enc, num_decoder_layers=dec, num_heads=heads, pad_token_id=0, eos_token_id=1,
        decoder_start_token_id=0, initializer_factor=factor, **extra))


class TestT5(parity.FamilyParity):
    CHECKPOINTS: ClassVar = {
        "t5-4heads-2+1layers-relu-scaled-8buckets": lambda: _t5(
            16, 4, 2, 1, relative_attention_num_buckets=8, relative_attention_max_distance=6),
        # a decoder deeper than the encoder ends transformers 5.23's own generate in an
        # IndexError, so the decoder is never the deeper here
        # heads of d_kv 8: 2 x 8 != d_model 12, as in Flan-T5-small
        "t5-2heads-of-8-3+2layers-gated-gelu-unscaled": lambda: _t5(
            12, 2, 3, 2, d_kv=8, factor=2.0, feed_forward_proj="gated-gelu", tie_word_embeddings=False,
            relative_attention_num_buckets=6, relative_attention_max_distance=5),
    }


def test_a_v1_1_config_as_transformers_4_wrote_it_reads_unscaled(tmp_path):
    """Before transformers 5, configs said tie_word_embeddings false where the head reads the
    decoder's output unscaled (T5 v1.1, Flan-T5); the kit reads both spellings alike."""
    reference = _t5(16, 4, 1, 1, feed_forward_proj="gated-gelu", tie_word_embeddings=False).eval()
    reference.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config.pop("scale_decoder_outputs", None)
    (tmp_path / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": False}))
    model = tk.from_hf(tmp_path).eval()
    ids = torch.randint(3, parity.VOCAB, (2, 9), generator=torch.Generator().manual_seed(0))
    tgt = torch.randint(3, parity.VOCAB, (2, 4), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = reference(input_ids=ids, decoder_input_ids=tgt).logits
        assert parity.relative_error(model(ids, tgt), expected) <= parity.TOLERANCE


def test_unsupported_variants_are_refused_naming_the_field(tmp_path):
    _t5(16, 4, 1, 1, feed_forward_proj="gated-relu").save_pretrained(tmp_path / "gated-relu")
    with pytest.raises(tk.CheckpointError, match="t5 checkpoint with feed_forward_proj 'gated-relu'"):
        tk.from_hf(tmp_path / "gated-relu")
