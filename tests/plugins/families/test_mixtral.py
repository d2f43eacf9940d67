"""The mixtral family: MixtralForCausalLM checkpoints (the top-k of a softmax over the experts,
always renormalised; block_sparse_moe's w1, w3, w2 experts; Mistral's sliding window) equal
transformers in PyTorch."""

from __future__ import annotations

from typing import ClassVar

import torch
import transformers as hf
from safetensors.torch import save_file

import transformer_kit as tk
from tests.plugins.families import moe_parity, parity


def _mixtral(hidden, heads, kv_heads, layers, experts, top_k, **extra):
    return parity.random_norms(hf.MixtralForCausalLM(hf.MixtralConfig(
        vocab_size=parity.VOCAB, hidden_size=hidden, intermediate_size=hidden + 8,
        num_local_experts=experts, num_experts_per_tok=top_k, num_attention_heads=heads,
        num_key_value_heads=kv_heads, num_hidden_layers=layers, max_position_embeddings=64,
        bos_token_id=1, eos_token_id=2, **extra)))


class TestMixtral(moe_parity.MoeFamilyParity):
    CHECKPOINTS: ClassVar = {
        "mixtral-8experts-top2-2layers-window4": lambda: _mixtral(24, 6, 2, 2, 8, 2, sliding_window=4),
        "mixtral-3experts-top1-2layers-tied": lambda: _mixtral(
            16, 4, 1, 2, 3, 1, tie_word_embeddings=True, rope_theta=1e6),
    }


def test_the_router_renormalises_and_the_window_is_mapped(tmp_path):
    _mixtral(16, 4, 2, 1, 4, 2, sliding_window=5).save_pretrained(tmp_path)
    config = tk.config_from_hf(tmp_path, pad_id=0)
    assert config.feedforward == tk.ComponentSpec(name="moe", params={
        "num_experts": 4, "top_k": 2, "router": "softmax", "normalize": True})
    assert config.mask == tk.ComponentSpec(name="sliding_window", params={"window": 5})


def test_experts_fused_as_transformers_holds_them_load_alike(tmp_path):
    """transformers 5 holds the experts fused (``mlp.experts.gate_up_proj``, ``down_proj``)
    under ``mlp``; a file written from that state dict loads to the same logits."""
    reference = _mixtral(16, 4, 2, 2, 4, 2).eval()
    reference.save_pretrained(tmp_path / "hub")
    (tmp_path / "fused").mkdir()
    (tmp_path / "fused" / "config.json").write_text((tmp_path / "hub" / "config.json").read_text())
    state = {k: v.clone().contiguous() for k, v in reference.state_dict().items()}
    assert "model.layers.0.mlp.experts.gate_up_proj" in state
    save_file(state, tmp_path / "fused" / "model.safetensors")
    hub, fused = tk.from_hf(tmp_path / "hub", pad_id=0), tk.from_hf(tmp_path / "fused", pad_id=0)
    ids = torch.randint(3, parity.VOCAB, (2, 7))
    with torch.no_grad():
        assert torch.equal(hub(ids), fused(ids))
        parity.check_pytorch(reference, fused)
