"""The gemma2 family: Gemma2ForCausalLM checkpoints equal transformers in PyTorch and
onnxruntime (sandwich norms, scores scaled by query_pre_attn_scalar and soft-capped,
sliding-window layers alternating with global ones, over sequences longer than the window)."""

from __future__ import annotations

from typing import ClassVar

import pytest
import torch
import transformers as hf

import transformer_kit as tk
from tests.plugins.families import parity


def gemma_norms(model: torch.nn.Module) -> torch.nn.Module:
    """Gemma initialises its norms' weights at zero: give them some spread."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.normal_(std=0.3)
    return model


def _gemma2(hidden, heads, kv_heads, layers, head_dim, **extra):
    return gemma_norms(hf.Gemma2ForCausalLM(hf.Gemma2Config(
        vocab_size=parity.VOCAB, hidden_size=hidden, intermediate_size=2 * hidden + 6,
        num_attention_heads=heads, num_key_value_heads=kv_heads, num_hidden_layers=layers,
        head_dim=head_dim, max_position_embeddings=64, bos_token_id=1, eos_token_id=2,
        pad_token_id=0, **extra)))


class TestGemma2(parity.FamilyParity):
    CHECKPOINTS: ClassVar = {
        # soft-capped scores (a small cap, so it bites) and logits, a window of 3 tokens
        "gemma2-4heads-kv2-3layers-window3-capped": lambda: _gemma2(
            24, 4, 2, 3, 8, sliding_window=3, attn_logit_softcapping=2.0,
            final_logit_softcapping=3.0, query_pre_attn_scalar=10),
        # no soft-caps, untied head, global layers only
        "gemma2-2heads-kv1-2layers-uncapped-global-untied": lambda: _gemma2(
            16, 2, 1, 2, 8, attn_logit_softcapping=None, final_logit_softcapping=None,
            layer_types=["full_attention"] * 2, tie_word_embeddings=False),
    }


def test_alternating_layers_become_layer_types(tmp_path):
    _gemma2(16, 2, 1, 3, 8, sliding_window=5).save_pretrained(tmp_path)
    config = tk.config_from_hf(tmp_path)
    assert config.layer_types == ["sliding_attention", "full_attention", "sliding_attention"]
    assert config.layer_variants["sliding_attention"]["mask"] == tk.ComponentSpec(
        name="sliding_window", params={"window": 5})
    assert config.attention.params["scale"] == 256 ** -0.5
    assert config.block.name == "sandwich"


def test_an_unknown_layer_type_is_refused_naming_the_field(tmp_path):
    _gemma2(16, 2, 1, 2, 8).save_pretrained(tmp_path)
    data = tk.checkpoints.read_hf_config(tmp_path)
    data["layer_types"] = ["chunked_attention", "full_attention"]
    (tmp_path / "config.json").write_text(__import__("json").dumps(data))
    with pytest.raises(tk.CheckpointError, match=r"layer_types \['chunked_attention'\]"):
        tk.from_hf(tmp_path)
