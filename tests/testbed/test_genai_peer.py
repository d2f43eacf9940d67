"""The onnxruntime-genai peer's checkpoint: a Llama checkpoint with the tokenizer files its model
builder asks for, loadable by transformers (model and tokenizer) and by from_hf alike. The
benchmark itself runs where onnxruntime-genai is installed (the bench extra)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

import transformer_kit as tk
from testbed.genai_peer import llama_checkpoint

#: Heads 16 wide: the narrowest onnxruntime-genai's GroupQueryAttention takes.
SMALL = {"hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 96, "vocab": 400}


def test_the_checkpoint_carries_a_tokenizer_both_sides_read(tmp_path):
    folder = llama_checkpoint(tmp_path / "llama", **SMALL)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    ids = tokenizer("the quick brown fox")["input_ids"]
    model = tk.from_hf(folder)
    assert model.tokenizer is not None
    assert list(model.tokenizer.encode(["the quick brown fox"])[0][0]) == ids
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    prompt = torch.tensor([ids])
    with torch.no_grad():
        np.testing.assert_allclose(model(prompt).numpy(), hf(prompt).logits.numpy(), rtol=1e-4, atol=1e-4)
    assert llama_checkpoint(tmp_path / "llama", **SMALL) == folder  # made once


def test_the_genai_generator_matches_the_kit_where_installed(tmp_path):
    pytest.importorskip("onnxruntime_genai")
    from testbed.genai_peer import GenaiGenerator, build_genai
    from transformer_kit.export import export_onnx
    from transformer_kit.runtime import OnnxModel

    folder = llama_checkpoint(tmp_path / "llama", **SMALL)
    export_onnx(tk.from_hf(folder), tmp_path / "kit")
    genai = GenaiGenerator(build_genai(folder, tmp_path / "genai", "fp32", tmp_path))
    ids = np.array([[5, 6, 7, 8]])
    expected = OnnxModel(tmp_path / "kit", providers="cpu").generate(ids, 6, min_new_tokens=6)
    assert np.array_equal(genai.generate(ids, 6), expected)
