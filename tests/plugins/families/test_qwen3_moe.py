"""The qwen3_moe family: Qwen3MoeForCausalLM checkpoints (top-k of a softmax over the experts,
renormalised or not; dense layers by mlp_only_layers and decoder_sparse_step) equal
transformers in PyTorch."""

from __future__ import annotations

import json
from typing import ClassVar

import pytest
import transformers as hf

import transformer_kit as tk
from tests.plugins.families import moe_parity, parity


def _qwen3_moe(hidden, heads, kv_heads, layers, experts, top_k, **extra):
    model = hf.Qwen3MoeForCausalLM(hf.Qwen3MoeConfig(
        vocab_size=parity.VOCAB, hidden_size=hidden, intermediate_size=2 * hidden + 6,
        moe_intermediate_size=hidden + 4, num_experts=experts, num_experts_per_tok=top_k,
        num_attention_heads=heads, num_key_value_heads=kv_heads, num_hidden_layers=layers,
        head_dim=8, max_position_embeddings=64, bos_token_id=1, eos_token_id=2, **extra))
    return parity.random_norms(model)


class TestQwen3Moe(moe_parity.MoeFamilyParity):
    CHECKPOINTS: ClassVar = {
        "qwen3_moe-8experts-top2-normalized-3layers-dense-middle": lambda: _qwen3_moe(
            24, 4, 2, 3, 8, 2, norm_topk_prob=True, mlp_only_layers=[1]),
        "qwen3_moe-4experts-top1-sparse-step2-tied": lambda: _qwen3_moe(
            16, 2, 1, 2, 4, 1, decoder_sparse_step=2, tie_word_embeddings=True),
        "qwen3_moe-6experts-top3-unnormalized-window4": lambda: _qwen3_moe(
            16, 2, 2, 2, 6, 3, use_sliding_window=True, sliding_window=4),
    }


def test_dense_layers_become_a_layer_variant(tmp_path):
    _qwen3_moe(16, 2, 1, 4, 4, 2, mlp_only_layers=[0], decoder_sparse_step=2).save_pretrained(tmp_path)
    config = tk.config_from_hf(tmp_path, pad_id=0)
    assert config.layer_types == ["dense", "sparse", "dense", "sparse"]
    assert config.layer_variants["dense"]["feedforward"] == tk.ComponentSpec(name="swiglu")
    assert config.feedforward == tk.ComponentSpec(name="moe", params={
        "num_experts": 4, "top_k": 2, "expert_d_ff": 20, "router": "softmax", "normalize": False})
    assert config.d_ff == 38


def test_a_zero_decoder_sparse_step_is_refused_naming_the_field(tmp_path):
    _qwen3_moe(16, 2, 1, 1, 4, 2).save_pretrained(tmp_path)
    data = tk.checkpoints.read_hf_config(tmp_path)
    data["decoder_sparse_step"] = 0
    (tmp_path / "config.json").write_text(json.dumps(data))
    with pytest.raises(tk.CheckpointError, match="qwen3_moe checkpoint with decoder_sparse_step 0"):
        tk.from_hf(tmp_path)
