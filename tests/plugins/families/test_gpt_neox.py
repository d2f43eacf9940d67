"""The gpt_neox family: GPTNeoXForCausalLM checkpoints (Pythia's layout: parallel residual,
partial rotary, per-head fused QKV) equal transformers in PyTorch and onnxruntime."""

from __future__ import annotations

import json
from typing import ClassVar

import pytest
import transformers as hf

import transformer_kit as tk
from tests.plugins.families import parity


def _neox(hidden, heads, layers, **extra):
    return hf.GPTNeoXForCausalLM(hf.GPTNeoXConfig(
        vocab_size=parity.VOCAB, hidden_size=hidden, intermediate_size=2 * hidden + 6,
        num_attention_heads=heads, num_hidden_layers=layers, max_position_embeddings=64,
        bos_token_id=1, eos_token_id=2, initializer_range=0.2, **extra))


class TestGptNeox(parity.FamilyParity):
    CHECKPOINTS: ClassVar = {
        "gpt_neox-4heads-2layers-rotary25": lambda: _neox(32, 4, 2),  # head_dim 8: 2 rotated
        "gpt_neox-2heads-3layers-rotary100-sequential-tied-tanh": lambda: _neox(
            16, 2, 3, rotary_pct=1.0, rotary_emb_base=500.0, use_parallel_residual=False,
            tie_word_embeddings=True, hidden_act="gelu_new"),
    }


def test_released_configs_with_rotary_pct_map_to_the_same_model(tmp_path):
    """Pythia's config.json says rotary_pct and rotary_emb_base (transformers now writes
    rope_parameters): both give rotary_dim and base."""
    _neox(32, 4, 1, rotary_pct=0.5, rotary_emb_base=777.0).save_pretrained(tmp_path)
    written = tk.config_from_hf(tmp_path, pad_id=0).positional.params
    config = json.loads((tmp_path / "config.json").read_text())
    for key in ("rope_parameters", "rope_scaling"):
        config.pop(key, None)
    (tmp_path / "config.json").write_text(json.dumps({**config, "rotary_pct": 0.5, "rotary_emb_base": 777.0}))
    assert tk.config_from_hf(tmp_path, pad_id=0).positional.params == written == {
        "base": 777.0, "rotary_dim": 4}


def test_rope_scaling_is_refused_naming_the_field(tmp_path):
    _neox(16, 2, 1, rope_scaling={"rope_type": "linear", "factor": 2.0}).save_pretrained(tmp_path)
    with pytest.raises(tk.CheckpointError, match="gpt_neox checkpoint with rope_type 'linear'"):
        tk.from_hf(tmp_path)
