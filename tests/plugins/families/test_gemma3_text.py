"""The gemma3_text family: Gemma3ForCausalLM checkpoints equal transformers in PyTorch and
onnxruntime (per-head (1 + weight) q/k norms, sliding layers with their own rotary base, the
global layers' rotary scaled)."""

from __future__ import annotations

from typing import ClassVar

import transformers as hf

import transformer_kit as tk
from tests.plugins.families import parity
from tests.plugins.families.test_gemma2 import gemma_norms


def _gemma3(hidden, heads, kv_heads, layers, head_dim, **extra):
    return gemma_norms(hf.Gemma3ForCausalLM(hf.Gemma3TextConfig(
        vocab_size=parity.VOCAB, hidden_size=hidden, intermediate_size=2 * hidden + 6,
        num_attention_heads=heads, num_key_value_heads=kv_heads, num_hidden_layers=layers,
        head_dim=head_dim, max_position_embeddings=64, bos_token_id=1, eos_token_id=2,
        pad_token_id=0, **extra)))


class TestGemma3Text(parity.FamilyParity):
    CHECKPOINTS: ClassVar = {
        # sliding, sliding, global; local base 10, global base 1e4 scaled linearly by 2
        "gemma3-4heads-kv2-3layers-window4-linear": lambda: _gemma3(
            24, 4, 2, 3, 8, sliding_window=4, sliding_window_pattern=3, query_pre_attn_scalar=8,
            rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0,
                                                "rope_theta": 10_000.0},
                             "sliding_attention": {"rope_type": "default", "rope_theta": 10.0}}),
        # soft-capped logits (the scores' cap is ignored, as by transformers), untied, one
        # global layer between two sliding ones
        "gemma3-2heads-kv1-3layers-capped-untied": lambda: _gemma3(
            16, 2, 1, 3, 8, sliding_window=3, attn_logit_softcapping=4.0,
            final_logit_softcapping=5.0, tie_word_embeddings=False,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"]),
    }


def test_sliding_layers_have_their_own_rotary_base(tmp_path):
    _gemma3(16, 2, 1, 2, 8, sliding_window=4, sliding_window_pattern=2).save_pretrained(tmp_path)
    config = tk.config_from_hf(tmp_path)
    assert config.layer_types == ["sliding_attention", "full_attention"]
    assert config.positional.params["base"] == 1_000_000.0
    assert config.layer_variants["sliding_attention"]["positional"].params["base"] == 10_000.0
    assert config.qk_norm.params["unit_offset"] is True


def _gemma3_with_vision(**text):
    text = dict(vocab_size=parity.VOCAB, hidden_size=16, intermediate_size=38, num_attention_heads=2,
                num_key_value_heads=1, num_hidden_layers=3, head_dim=8, max_position_embeddings=64,
                bos_token_id=1, eos_token_id=2, pad_token_id=0, **text)
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                  image_size=28, patch_size=14)
    return gemma_norms(hf.Gemma3ForConditionalGeneration(hf.Gemma3Config(
        text_config=text, vision_config=vision, mm_tokens_per_image=4, image_token_index=60,
        boi_token_index=58, eoi_token_index=59)))


class TestGemma3LanguageModel(parity.FamilyParity):
    """model_type gemma3: the language model of Gemma3ForConditionalGeneration, given text."""

    CHECKPOINTS: ClassVar = {
        "gemma3-multimodal-3layers-window3": lambda: _gemma3_with_vision(
            sliding_window=3, sliding_window_pattern=3),
    }
