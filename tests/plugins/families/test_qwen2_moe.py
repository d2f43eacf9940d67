"""The qwen2_moe family: Qwen2MoeForCausalLM checkpoints (Qwen3-MoE's router with a shared
expert scaled by a sigmoid gate, biases on q, k and v) equal transformers in PyTorch."""

from __future__ import annotations

from typing import ClassVar

import pytest
import transformers as hf

import transformer_kit as tk
from tests.plugins.families import moe_parity, parity

# transformers builds a shared expert of width 0 (none) as empty linears, and says so
pytestmark = pytest.mark.filterwarnings("ignore:Initializing zero-element tensors:UserWarning")


def _qwen2_moe(hidden, heads, kv_heads, layers, experts, top_k, shared, **extra):
    return parity.random_norms(hf.Qwen2MoeForCausalLM(hf.Qwen2MoeConfig(
        vocab_size=parity.VOCAB, hidden_size=hidden, intermediate_size=2 * hidden + 6,
        moe_intermediate_size=hidden + 4, shared_expert_intermediate_size=shared,
        num_experts=experts, num_experts_per_tok=top_k, num_attention_heads=heads,
        num_key_value_heads=kv_heads, num_hidden_layers=layers, max_position_embeddings=64,
        bos_token_id=1, eos_token_id=2, **extra)))


class TestQwen2Moe(moe_parity.MoeFamilyParity):
    CHECKPOINTS: ClassVar = {
        "qwen2_moe-6experts-top2-shared-3layers-dense-first": lambda: _qwen2_moe(
            24, 4, 2, 3, 6, 2, 36, mlp_only_layers=[0]),
        "qwen2_moe-4experts-top1-no-shared-normalized-tied": lambda: _qwen2_moe(
            16, 2, 1, 2, 4, 1, 0, norm_topk_prob=True, tie_word_embeddings=True),
        "qwen2_moe-5experts-top3-shared-normalized-no-qkv-bias": lambda: _qwen2_moe(
            16, 2, 2, 2, 5, 3, 12, norm_topk_prob=True, qkv_bias=False),
    }


def test_the_shared_expert_and_its_gate_are_loaded(tmp_path):
    _qwen2_moe(16, 2, 1, 1, 4, 2, 12).save_pretrained(tmp_path)
    model = tk.from_hf(tmp_path, pad_id=0)
    moe = model.decoder.layers[0].feedforward
    assert model.config.feedforward.params["shared_expert_d_ff"] == 12
    assert moe.shared_expert.gate.weight.shape == (12, 16)
    assert moe.shared_expert_gate.weight.shape == (1, 16)
    assert model.config.attention_bias and model.config.attention_out_bias is False


def test_a_shared_expert_of_width_zero_is_none(tmp_path):
    _qwen2_moe(16, 2, 1, 1, 4, 2, 0).save_pretrained(tmp_path)
    model = tk.from_hf(tmp_path, pad_id=0)
    assert "shared_expert_d_ff" not in model.config.feedforward.params
    assert model.decoder.layers[0].feedforward.shared_expert is None


def test_sliding_windows_are_refused_naming_the_field(tmp_path):
    _qwen2_moe(16, 2, 1, 2, 4, 2, 0, use_sliding_window=True, sliding_window=3,
               max_window_layers=2).save_pretrained(tmp_path)
    with pytest.raises(tk.CheckpointError, match="qwen2_moe checkpoint with use_sliding_window True"):
        tk.from_hf(tmp_path)
