"""The qwen2 family: Qwen2ForCausalLM checkpoints (biases on q, k, v, none on the output
projection) equal transformers in PyTorch and onnxruntime."""

from __future__ import annotations

from typing import ClassVar

import pytest
import transformers as hf

import transformer_kit as tk
from tests.plugins.families import parity


def _qwen2(hidden, heads, kv_heads, layers, **extra):
    return hf.Qwen2ForCausalLM(hf.Qwen2Config(
        vocab_size=parity.VOCAB, hidden_size=hidden, intermediate_size=2 * hidden + 6,
        num_attention_heads=heads, num_key_value_heads=kv_heads, num_hidden_layers=layers,
        max_position_embeddings=64, bos_token_id=1, eos_token_id=2, **extra))


class TestQwen2(parity.FamilyParity):
    CHECKPOINTS: ClassVar = {
        "qwen2-6heads-kv2-2layers": lambda: _qwen2(24, 6, 2, 2),
        "qwen2-4heads-kv1-2layers-window3-tied": lambda: _qwen2(
            16, 4, 1, 2, use_sliding_window=True, max_window_layers=0, sliding_window=3,
            tie_word_embeddings=True),
    }


def test_biases_on_q_k_v_only(tmp_path):
    _qwen2(16, 4, 2, 1).save_pretrained(tmp_path)
    model = tk.from_hf(tmp_path, pad_id=0)
    attention = model.decoder.layers[0].self_attention
    assert model.config.attention_bias and model.config.attention_out_bias is False
    assert attention.q_proj.bias is not None and attention.v_proj.bias is not None
    assert attention.o_proj.bias is None


def test_sliding_windows_on_some_layers_only_are_refused(tmp_path):
    mixed = _qwen2(16, 4, 2, 3, use_sliding_window=True, max_window_layers=1, sliding_window=3)
    mixed.save_pretrained(tmp_path)
    with pytest.raises(tk.CheckpointError, match="qwen2 checkpoint with layer_types"):
        tk.from_hf(tmp_path)
