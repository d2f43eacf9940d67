"""The olmoe family: OlmoeForCausalLM checkpoints (RMSNorm over the whole q and k projections,
the top-k of a softmax over the experts, renormalised only with norm_topk_prob) equal
transformers in PyTorch."""

from __future__ import annotations

import json
from typing import ClassVar

import pytest
import transformers as hf

import transformer_kit as tk
from tests.plugins.families import moe_parity, parity


def _olmoe(hidden, heads, kv_heads, layers, experts, top_k, **extra):
    return parity.random_norms(hf.OlmoeForCausalLM(hf.OlmoeConfig(
        vocab_size=parity.VOCAB, hidden_size=hidden, intermediate_size=hidden + 8,
        num_experts=experts, num_experts_per_tok=top_k, num_attention_heads=heads,
        num_key_value_heads=kv_heads, num_hidden_layers=layers, max_position_embeddings=64,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, **extra)))


class TestOlmoe(moe_parity.MoeFamilyParity):
    CHECKPOINTS: ClassVar = {
        "olmoe-8experts-top2-unnormalized-6heads-kv2": lambda: _olmoe(24, 6, 2, 2, 8, 2),
        "olmoe-4experts-top1-normalized-bias-tied": lambda: _olmoe(
            16, 4, 4, 2, 4, 1, norm_topk_prob=True, attention_bias=True, tie_word_embeddings=True),
        "olmoe-6experts-top3-normalized": lambda: _olmoe(16, 2, 2, 2, 6, 3, norm_topk_prob=True),
    }


def test_the_whole_projections_are_normed_before_the_sublayers(tmp_path):
    _olmoe(24, 6, 2, 1, 4, 2).save_pretrained(tmp_path)
    model = tk.from_hf(tmp_path)
    qk_norm = model.decoder.layers[0].self_attention.qk_norm
    assert (model.config.qk_norm.name, model.config.block.name) == ("rmsnorm", "pre_norm")
    assert qk_norm.q_norm.weight.shape == (24,) and qk_norm.k_norm.weight.shape == (8,)
    assert model.config.feedforward.params["normalize"] is False


def test_clip_qkv_is_refused_naming_the_field(tmp_path):
    _olmoe(16, 2, 2, 1, 4, 2).save_pretrained(tmp_path)
    data = json.loads((tmp_path / "config.json").read_text())
    data["clip_qkv"] = 8.0
    (tmp_path / "config.json").write_text(json.dumps(data))
    with pytest.raises(tk.CheckpointError, match=r"olmoe checkpoint with clip_qkv 8\.0"):
        tk.from_hf(tmp_path)
