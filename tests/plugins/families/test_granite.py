"""The granite family: GraniteForCausalLM checkpoints (Llama's layout with embedding, residual,
attention and logits multipliers) equal transformers in PyTorch and onnxruntime."""

from __future__ import annotations

import json
from typing import ClassVar

import pytest
import torch
import transformers as hf

import transformer_kit as tk
from tests.plugins.families import parity


def _granite(hidden, heads, kv_heads, layers, **extra):
    model = hf.GraniteForCausalLM(hf.GraniteConfig(
        vocab_size=parity.VOCAB, hidden_size=hidden, intermediate_size=2 * hidden + 6,
        num_attention_heads=heads, num_key_value_heads=kv_heads, num_hidden_layers=layers,
        max_position_embeddings=64, bos_token_id=1, eos_token_id=2, **extra))
    with torch.no_grad():  # transformers starts biases at zero: a misplaced one would not show
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(std=0.1)
    return parity.random_norms(model)


MULTIPLIERS = {"embedding_multiplier": 12.0, "residual_multiplier": 0.22,
               "attention_multiplier": 0.015, "logits_scaling": 8.0}


class TestGranite(parity.FamilyParity):
    CHECKPOINTS: ClassVar = {
        "granite-4heads-kv2-2layers-untied": lambda: _granite(32, 4, 2, 2, **MULTIPLIERS),
        "granite-4heads-kv4-2layers-biases-tied": lambda: _granite(
            16, 4, 4, 2, attention_bias=True, mlp_bias=True, tie_word_embeddings=True,
            embedding_multiplier=6.0, residual_multiplier=0.5, attention_multiplier=0.3,
            logits_scaling=3.0, rope_theta=1000.0),
    }


def test_the_multipliers_map_to_config_options(tmp_path):
    _granite(16, 4, 2, 1, **MULTIPLIERS).save_pretrained(tmp_path)
    config = tk.config_from_hf(tmp_path, pad_id=0)
    assert config.embedding_scale == 12.0 and not config.scale_embeddings
    assert config.block == tk.ComponentSpec(name="pre_norm", params={"residual_scale": 0.22})
    assert config.attention == tk.ComponentSpec(name="sdpa", params={"scale": 0.015})
    assert config.logit_scale == 1 / 8 and config.logit_softcap is None


def test_multipliers_of_one_leave_the_config_plain(tmp_path):
    _granite(16, 4, 2, 1, attention_multiplier=0.5).save_pretrained(tmp_path)
    config = tk.config_from_hf(tmp_path, pad_id=0)
    assert (config.embedding_scale, config.logit_scale) == (None, None)
    assert config.block == tk.ComponentSpec(name="pre_norm")
    assert config.attention.params == {"scale": 0.5}  # Granite's scale is never 1/sqrt(head_dim)


@pytest.mark.parametrize("key", list(MULTIPLIERS))
def test_a_multiplier_that_is_not_positive_is_refused_naming_it(tmp_path, key):
    _granite(16, 4, 2, 1).save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), key: 0}))
    with pytest.raises(tk.CheckpointError, match=f"granite checkpoint with {key} 0 "):
        tk.config_from_hf(tmp_path)
