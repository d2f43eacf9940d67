"""The llama family: LlamaForCausalLM checkpoints equal transformers in PyTorch and onnxruntime."""

from __future__ import annotations

from typing import ClassVar

import transformers as hf

from tests.plugins.families import parity


def _llama(hidden, heads, kv_heads, layers, **extra):
    return hf.LlamaForCausalLM(hf.LlamaConfig(
        vocab_size=parity.VOCAB, hidden_size=hidden, intermediate_size=2 * hidden + 6,
        num_attention_heads=heads, num_key_value_heads=kv_heads, num_hidden_layers=layers,
        max_position_embeddings=64, bos_token_id=1, eos_token_id=2, **extra))


class TestLlama(parity.FamilyParity):
    CHECKPOINTS: ClassVar = {
        "llama-6heads-of-6-kv2-2layers": lambda: _llama(24, 6, 2, 2, head_dim=6),  # 6 x 6 != 24
        "llama-4heads-kv1-1layer-tied": lambda: _llama(16, 4, 1, 1, tie_word_embeddings=True,
                                                       rope_theta=500000.0),
        "llama-5heads-kv5-3layers": lambda: _llama(20, 5, 5, 3, attention_bias=True),
    }
