"""The granitemoe and granitemoeshared families: GraniteMoeForCausalLM and
GraniteMoeSharedForCausalLM checkpoints (Granite's multipliers; the top-k router logits, then a
softmax over the k; fused input_linear/output_linear experts; an ungated shared expert) equal
transformers in PyTorch and onnxruntime."""

from __future__ import annotations

import json
from typing import ClassVar

import pytest
import torch
import transformers as hf

import transformer_kit as tk
from tests.plugins.families import moe_parity, parity

MULTIPLIERS = {"embedding_multiplier": 6.0, "residual_multiplier": 0.5,
               "attention_multiplier": 0.3, "logits_scaling": 3.0}


def _biased(model: torch.nn.Module) -> torch.nn.Module:
    with torch.no_grad():  # transformers starts biases at zero: a misplaced one would not show
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(std=0.1)
    return parity.random_norms(model)


def _granitemoe(hidden, heads, kv_heads, layers, experts, top_k, **extra):
    return _biased(hf.GraniteMoeForCausalLM(hf.GraniteMoeConfig(
        vocab_size=parity.VOCAB, hidden_size=hidden, intermediate_size=hidden + 8,
        num_local_experts=experts, num_experts_per_tok=top_k, num_attention_heads=heads,
        num_key_value_heads=kv_heads, num_hidden_layers=layers, max_position_embeddings=64,
        bos_token_id=1, eos_token_id=2, **extra)))


def _granitemoeshared(hidden, heads, kv_heads, layers, experts, top_k, shared, **extra):
    return _biased(hf.GraniteMoeSharedForCausalLM(hf.GraniteMoeSharedConfig(
        vocab_size=parity.VOCAB, hidden_size=hidden, intermediate_size=hidden + 8,
        shared_intermediate_size=shared, num_local_experts=experts, num_experts_per_tok=top_k,
        num_attention_heads=heads, num_key_value_heads=kv_heads, num_hidden_layers=layers,
        max_position_embeddings=64, bos_token_id=1, eos_token_id=2, **extra)))


class TestGraniteMoe(moe_parity.MoeFamilyParity):
    CHECKPOINTS: ClassVar = {
        "granitemoe-6experts-top2-2layers-untied": lambda: _granitemoe(24, 4, 2, 2, 6, 2, **MULTIPLIERS),
        "granitemoe-4experts-top1-2layers-tied-biases": lambda: _granitemoe(
            16, 2, 1, 2, 4, 1, tie_word_embeddings=True, attention_bias=True,
            embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.015,
            logits_scaling=8.0, rope_theta=1000.0),
    }


class TestGraniteMoeShared(moe_parity.MoeFamilyParity):
    CHECKPOINTS: ClassVar = {
        "granitemoeshared-5experts-top3-shared-2layers-untied": lambda: _granitemoeshared(
            16, 4, 2, 2, 5, 3, 20, **MULTIPLIERS),
        "granitemoeshared-4experts-top1-no-shared-tied": lambda: _granitemoeshared(
            16, 2, 2, 2, 4, 1, 0, tie_word_embeddings=True, **MULTIPLIERS),
    }


def test_the_router_and_multipliers_map_to_config_options(tmp_path):
    _granitemoe(16, 2, 1, 1, 4, 2, **MULTIPLIERS).save_pretrained(tmp_path)
    config = tk.config_from_hf(tmp_path, pad_id=0)
    assert config.feedforward == tk.ComponentSpec(name="moe", params={
        "num_experts": 4, "top_k": 2, "router": "softmax_topk"})
    assert config.d_ff == 24 and config.logit_scale == 1 / 3 and config.embedding_scale == 6.0
    assert config.attention == tk.ComponentSpec(name="sdpa", params={"scale": 0.3})


def test_the_shared_expert_is_gated_by_exactly_one(tmp_path):
    """The ungated shared expert: a zero sigmoid gate (1/2) and its down projection doubled."""
    reference = _granitemoeshared(16, 2, 1, 1, 4, 2, 12).eval()
    reference.save_pretrained(tmp_path)
    moe = tk.from_hf(tmp_path, pad_id=0).decoder.layers[0].feedforward
    shared = reference.model.layers[0].shared_mlp
    assert moe.shared_expert_gate.weight.abs().max() == 0
    assert torch.equal(moe.shared_expert.down.weight, shared.output_linear.weight * 2)
    x = torch.randn(5, 16)
    with torch.no_grad():
        gate = torch.sigmoid(moe.shared_expert_gate(x))
        assert (gate == 0.5).all()  # exactly: times the doubled projection, the expert's own output
        # the fused input_linear and the gate and up apart round their sums alike only up to order
        torch.testing.assert_close(gate * moe.shared_expert(x), shared(x), rtol=1e-5, atol=1e-7)


def test_the_gate_is_the_first_half_of_input_linear(tmp_path):
    reference = _granitemoe(16, 2, 1, 1, 3, 1).eval()
    reference.save_pretrained(tmp_path)
    moe = tk.from_hf(tmp_path, pad_id=0).decoder.layers[0].feedforward
    fused = reference.model.layers[0].block_sparse_moe.experts.gate_up_proj[2]  # (2 x 24, 16)
    assert torch.equal(moe.experts[2].gate.weight, fused[:24])
    assert torch.equal(moe.experts[2].up.weight, fused[24:])


@pytest.mark.parametrize(("key", "value"), [("num_local_experts", 0), ("hidden_act", "gelu"),
                                            ("residual_multiplier", -1.0)])
def test_unsupported_variants_are_refused_naming_the_field(tmp_path, key, value):
    _granitemoe(16, 2, 1, 1, 4, 2).save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), key: value}))
    with pytest.raises(tk.CheckpointError, match=f"granitemoe checkpoint with {key} "):
        tk.config_from_hf(tmp_path)
