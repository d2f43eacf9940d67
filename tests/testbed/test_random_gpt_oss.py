"""The random gpt-oss checkpoint in the Hub's layout (testbed/random_gpt_oss.py), at a tiny
shape: the Hub's names, dtypes and shapes, a tokenizer of exactly the vocabulary, and the kit's
logits equal transformers' (which dequantizes the MXFP4 experts on a CPU without kernels)."""

from __future__ import annotations

import json

import pytest
import torch
import transformers as hf
from safetensors import safe_open

import transformer_kit as tk
from testbed.random_gpt_oss import GPT_OSS_20B, gpt_oss_config, tensor_shapes, write_random_gpt_oss
from transformer_kit.export.verify import relative_error

TINY = {"layers": 3, "hidden": 64, "heads": 4, "kv_heads": 2, "head_dim": 16, "experts": 4, "top_k": 2,
        "intermediate": 96, "vocab": 512, "sliding_window": 4}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpt-oss-tiny")
    write_random_gpt_oss(folder, gpt_oss_config(**TINY), shard_bytes=100_000)
    return folder


def test_the_20b_shape_is_the_hub_s_and_about_13_8_gb():
    assert gpt_oss_config() == GPT_OSS_20B
    shapes = {name: shape for name, shape, _ in tensor_shapes(GPT_OSS_20B)}
    assert shapes["model.layers.0.mlp.experts.gate_up_proj_blocks"] == (32, 5760, 90, 16)
    assert shapes["model.layers.23.mlp.experts.down_proj_scales"] == (32, 2880, 90)
    assert shapes["model.layers.0.self_attn.q_proj.weight"] == (4096, 2880)
    total = sum(torch.Size(shape).numel() * (1 if kind in ("blocks", "scales") else 2)
                for _, shape, kind in tensor_shapes(GPT_OSS_20B))
    assert 13.5e9 < total < 14e9


def test_the_files_are_the_hub_s_layout(tiny):
    index = json.loads((tiny / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 1 and files[0] == f"model-00000-of-{len(files) - 1:05d}.safetensors"
    with safe_open(tiny / files[0], "pt") as f, safe_open(tiny / files[-1], "pt") as g:
        embed, head = f.get_tensor("model.embed_tokens.weight"), g.get_tensor("lm_head.weight")
    assert embed.dtype == head.dtype == torch.bfloat16 and embed.shape == (512, 64)
    name = "model.layers.1.mlp.experts.gate_up_proj"
    with safe_open(tiny / index["weight_map"][f"{name}_blocks"], "pt") as f:
        blocks = f.get_tensor(f"{name}_blocks")
    with safe_open(tiny / index["weight_map"][f"{name}_scales"], "pt") as f:
        scales = f.get_tensor(f"{name}_scales")
    assert blocks.dtype == scales.dtype == torch.uint8
    assert blocks.shape == (4, 192, 2, 16) and scales.shape == (4, 192, 2)
    assert int(scales.min()) >= 120 and int(scales.max()) <= 122
    tokenizer = hf.AutoTokenizer.from_pretrained(tiny)
    assert len(tokenizer) == 512 and tokenizer.convert_tokens_to_ids("<|return|>") == 500


def test_the_kit_s_logits_equal_transformers(tiny):
    reference = hf.GptOssForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()
    model = tk.from_hf(tiny)
    assert model.config.pad_id == 497 and 500 in model.config.eos_id
    ids = torch.randint(0, 496, (2, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = reference(input_ids=ids).logits
        ours = model(ids)
    assert relative_error(ours.numpy(), expected.numpy()) <= 1e-5
