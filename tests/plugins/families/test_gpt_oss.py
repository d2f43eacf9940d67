"""The gpt_oss family: GptOssForCausalLM checkpoints (attention sinks, sliding layers
alternating with full ones, YaRN, biases on q/k/v/o, the top-k of biased router logits and
clamped-SwiGLU experts with biases) equal transformers in PyTorch and onnxruntime; the Hub's
MXFP4 experts read as transformers' own dequantization gives them."""

from __future__ import annotations

import json
from typing import ClassVar

import numpy as np
import pytest
import torch
import transformers as hf
from safetensors.torch import load_file, save_file
from transformers.integrations.mxfp4 import FP4_VALUES, convert_moe_packed_tensors

import transformer_kit as tk
from tests.plugins.families import moe_parity, parity
from transformer_kit.export import export_onnx
from transformer_kit.export.verify import relative_error
from transformer_kit.runtime import OnnxModel


def _gpt_oss(hidden, heads, kv_heads, layers, experts, top_k, window, **extra):
    model = hf.GptOssForCausalLM(hf.GptOssConfig(
        vocab_size=parity.VOCAB, hidden_size=hidden,
        intermediate_size=extra.pop("intermediate_size", hidden + 8), num_local_experts=experts,
        num_experts_per_tok=top_k, num_attention_heads=heads,
        num_key_value_heads=kv_heads, num_hidden_layers=layers, head_dim=8, sliding_window=window,
        max_position_embeddings=64, bos_token_id=1, eos_token_id=2, **extra))
    return moe_parity.spread_gpt_oss(parity.random_norms(model))


class TestGptOss(moe_parity.MoeFamilyParity):
    CHECKPOINTS: ClassVar = {
        "gpt_oss-4experts-top1-window3-tied-3layers": lambda: _gpt_oss(
            16, 4, 2, 3, 4, 1, 3, tie_word_embeddings=True),
        "gpt_oss-6experts-top3-window4-full-first": lambda: _gpt_oss(
            24, 3, 1, 2, 6, 3, 4, layer_types=["full_attention", "sliding_attention"],
            swiglu_limit=5.0, swiglu_alpha=1.5),
    }


def test_the_clamp_acts_in_the_test_checkpoints():
    """The experts' pre-activations pass swiglu_limit somewhere (or the clamp is untested)."""
    torch.manual_seed(0)
    model = _gpt_oss(16, 4, 2, 1, 4, 1, 3).eval()
    seen = []
    experts = model.model.layers[0].mlp.experts
    experts.register_forward_hook(lambda _m, args, _o: seen.append(args[0]))
    ids, mask = torch.randint(3, parity.VOCAB, (2, 9)), torch.ones(2, 9, dtype=torch.long)
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
    gate_up = seen[0] @ experts.gate_up_proj + experts.gate_up_proj_bias[:, None]  # (E, T, 2I)
    assert (gate_up.abs() > experts.limit).float().mean() > 0.02


def test_config_maps_every_feature(tmp_path):
    _gpt_oss(16, 4, 2, 4, 4, 2, 3).save_pretrained(tmp_path)
    config = tk.config_from_hf(tmp_path, pad_id=0)
    assert config.attention == tk.ComponentSpec(name="sdpa", params={"sinks": True})
    assert config.attention_bias and config.layer_types == ["sliding_attention", "full_attention"] * 2
    assert config.layer_variants["sliding_attention"]["mask"] == tk.ComponentSpec(
        name="sliding_window", params={"window": 3})
    assert config.feedforward == tk.ComponentSpec(name="moe", params={
        "num_experts": 4, "top_k": 2, "router": "softmax_topk", "router_bias": True,
        "expert": {"name": "swiglu", "bias": True, "alpha": 1.702, "limit": 7.0, "up_offset": 1.0}})
    scaling = config.positional.params["scaling"]
    assert scaling["type"] == "yarn" and scaling["truncate"] is False


def test_the_hub_s_config_layout_maps_alike(tmp_path):
    """gpt-oss-20b's config.json as the Hub has it (written by transformers 4.55): rope_scaling
    and a top-level rope_theta instead of rope_parameters, no swiglu_alpha, the MXFP4
    quantization_config; hidden_act, which transformers' gpt-oss never reads, ignored."""
    _gpt_oss(16, 4, 2, 2, 4, 2, 3).save_pretrained(tmp_path)
    expected = tk.config_from_hf(tmp_path, pad_id=0)
    data = json.loads((tmp_path / "config.json").read_text())
    rope = data.pop("rope_parameters")
    data.update(rope_theta=rope.pop("rope_theta"), rope_scaling=rope, experts_per_token=2,
                quantization_config={"quant_method": "mxfp4", "modules_to_not_convert": ["lm_head"]})
    del data["swiglu_alpha"]
    data["hidden_act"] = "gelu"
    (tmp_path / "config.json").write_text(json.dumps(data))
    assert tk.config_from_hf(tmp_path, pad_id=0) == expected


@pytest.mark.parametrize("truncate", [False, True])
def test_yarn_at_gpt_oss_20b_s_settings_equals_transformers(truncate):
    """head_dim 64, rope_theta 150000, factor 32 over 4096 positions, beta 32 / 1: the same
    frequencies and attention factor as transformers' yarn, bit for bit."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": truncate,
            "original_max_position_embeddings": 4096, "rope_theta": 150000.0}
    inv_freq, attention_factor = ROPE_INIT_FUNCTIONS["yarn"](hf.GptOssConfig(rope_parameters=rope))
    ours = tk.get_registry().create("positional", "rotary", context={"head_dim": 64}, base=150000.0,
                                    scaling={"type": "yarn", **{k: v for k, v in rope.items()
                                                                if k not in ("rope_type", "rope_theta")}})
    assert torch.equal(ours.inv_freq, inv_freq) and ours.attention_factor == attention_factor


# -- MXFP4 ------------------------------------------------------------------------------------
_CODES = np.array(FP4_VALUES, dtype=np.float32)


def _quantize_mxfp4(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """weight (..., rows, K) float32 -> (blocks (..., rows, K / 32, 16), scales (..., rows,
    K / 32)) uint8: per 32 values the exponent that brings the largest under 6 (E2M1's
    largest), each value the nearest E2M1 code, two codes a byte (low nibble first)."""
    blocks = weight.reshape(*weight.shape[:-1], -1, 32)  # (..., rows, groups, 32)
    largest = np.abs(blocks).max(axis=-1, keepdims=True)
    exponent = np.ceil(np.log2(np.maximum(largest, 1e-30) / 6.0)).astype(np.int32)
    scaled = blocks / np.exp2(exponent)
    codes = np.abs(scaled[..., None] - _CODES).argmin(axis=-1).astype(np.uint8)  # (..., 32)
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return packed, (exponent[..., 0] + 127).astype(np.uint8)


def _mxfp4_checkpoint(folder):
    """A random gpt-oss checkpoint rewritten with its experts in the Hub's MXFP4 layout; the
    reference model with the experts transformers' ``convert_moe_packed_tensors`` reads from
    those bytes."""
    torch.manual_seed(7)
    reference = _gpt_oss(32, 4, 2, 2, 4, 2, 3, intermediate_size=64).eval()
    reference.save_pretrained(folder)
    tensors = load_file(folder / "model.safetensors")
    for name in [n for n in tensors if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        stored = tensors.pop(name).transpose(1, 2).contiguous().numpy()  # (experts, out, in)
        blocks, scales = _quantize_mxfp4(stored)
        tensors[f"{name}_blocks"] = torch.from_numpy(blocks)
        tensors[f"{name}_scales"] = torch.from_numpy(scales)
        param = reference.get_parameter(name)
        with torch.no_grad():
            param.copy_(convert_moe_packed_tensors(tensors[f"{name}_blocks"], tensors[f"{name}_scales"],
                                                   dtype=torch.float32))
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    data = json.loads((folder / "config.json").read_text())
    data["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    (folder / "config.json").write_text(json.dumps(data))
    return reference


def test_mxfp4_experts_read_as_transformers_dequantizes_them(tmp_path):
    """Bit for bit in float32, so transformers' logits in PyTorch; streamed (dequantized
    while the export writes the weights), transformers' logits in onnxruntime."""
    reference = _mxfp4_checkpoint(tmp_path / "checkpoint")
    model = tk.from_hf(tmp_path / "checkpoint", pad_id=0)
    for layer, theirs in zip(model.decoder.layers, reference.model.layers, strict=True):
        ff, experts = layer.feedforward, theirs.mlp.experts
        for e in range(4):
            assert torch.equal(ff.experts[e].gate.weight, experts.gate_up_proj[e][:, 0::2].T)
            assert torch.equal(ff.experts[e].up.weight, experts.gate_up_proj[e][:, 1::2].T)
            assert torch.equal(ff.experts[e].down.weight, experts.down_proj[e].T)
    ids, mask = parity.batch(model)
    real = mask.bool().numpy()
    with torch.no_grad():
        expected = reference(input_ids=ids, attention_mask=mask).logits.numpy()
        ours = model(ids, attention_mask=mask).numpy()
    assert relative_error(ours[real], expected[real]) <= parity.TOLERANCE
    streamed = tk.from_hf(tmp_path / "checkpoint", stream=True, pad_id=0)
    export_onnx(streamed, tmp_path / "onnx")
    ours = OnnxModel(tmp_path / "onnx", providers="cpu")(ids.numpy(), attention_mask=mask.numpy())
    assert relative_error(ours[real], expected[real]) <= parity.TOLERANCE


# -- refusals ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("change", "message"), [
    ({"quantization_config": {"quant_method": "gptq"}},
     r"quantization_config.quant_method 'gptq' \(the kit reads float and mxfp4 checkpoints\)"),
    ({"layer_types": ["chunked_attention", "full_attention"]}, r"layer_types \['chunked_attention'\]"),
    ({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}},
     r"rope_parameters of type 'dynamic'"),
    ({"swiglu_limit": -1.0}, r"swiglu_limit -1.0 \(a positive clamp bound\)"),
    ({"sliding_window": None}, r"sliding layers and sliding_window None"),
], ids=str)
def test_variants_the_kit_does_not_compute_are_refused_naming_the_field(change, message, tmp_path):
    _gpt_oss(16, 4, 2, 2, 4, 2, 3).save_pretrained(tmp_path)
    data = json.loads((tmp_path / "config.json").read_text())
    data.update(change)
    (tmp_path / "config.json").write_text(json.dumps(data))
    with pytest.raises(tk.CheckpointError, match=r"gpt_oss checkpoint with " + message):
        tk.from_hf(tmp_path, pad_id=0)
