"""The smollm3 family: SmolLM3ForCausalLM checkpoints equal transformers in PyTorch and
onnxruntime (layers without rotary; sliding-window layers when configured)."""

from __future__ import annotations

from typing import ClassVar

import transformers as hf

import transformer_kit as tk
from tests.plugins.families import parity


def _smollm3(hidden, heads, kv_heads, layers, **extra):
    return parity.random_norms(hf.SmolLM3ForCausalLM(hf.SmolLM3Config(
        vocab_size=parity.VOCAB, hidden_size=hidden, intermediate_size=2 * hidden + 6,
        num_attention_heads=heads, num_key_value_heads=kv_heads, num_hidden_layers=layers,
        max_position_embeddings=64, bos_token_id=1, eos_token_id=2, pad_token_id=0, **extra)))


class TestSmolLM3(parity.FamilyParity):
    CHECKPOINTS: ClassVar = {
        # the fourth layer without rotary (the default interval), tied embeddings
        "smollm3-4heads-kv2-4layers-nope-every-4th": lambda: _smollm3(
            16, 4, 2, 4, tie_word_embeddings=True, rope_theta=1000.0),
        # layers 0 and 2 without rotary and with a window of 3, biases, untied
        "smollm3-2heads-kv1-3layers-sliding-nope": lambda: _smollm3(
            16, 2, 1, 3, no_rope_layers=[0, 1, 0], use_sliding_window=True, sliding_window=3,
            attention_bias=True, tie_word_embeddings=False),
    }


def test_layers_without_rotary_are_a_variant(tmp_path):
    _smollm3(16, 2, 1, 4).save_pretrained(tmp_path)
    config = tk.config_from_hf(tmp_path)
    assert config.layer_types == ["full_attention"] * 3 + ["full_attention_no_rope"]
    assert config.layer_variants == {"full_attention": {},
                                     "full_attention_no_rope": {"positional": tk.ComponentSpec(name="none")}}
