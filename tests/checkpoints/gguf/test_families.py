"""The 2026 architectures llama.cpp writes (gemma2, gemma3, phi3, granite, smollm3): the config
dict a GGUF file's metadata gives is the source checkpoint's, and the file loads equal to the
source."""

from __future__ import annotations

import pytest
import torch
import transformers as hf

import transformer_kit as tk
from tests.checkpoints.gguf.writer import write_gguf
from transformer_kit.checkpoints.gguf.config import hf_config
from transformer_kit.checkpoints.gguf.file import open_gguf, read_metadata
from transformer_kit.export.verify import relative_error

_SIZES = dict(vocab_size=61, hidden_size=64, intermediate_size=96, num_attention_heads=4,
              num_key_value_heads=2, num_hidden_layers=2, max_position_embeddings=64,
              bos_token_id=1, eos_token_id=2, pad_token_id=0)
#: GGUF architecture -> (a random source checkpoint, its model_type).
SOURCES = {
    "gemma2": (lambda: hf.Gemma2ForCausalLM(hf.Gemma2Config(
        **_SIZES, head_dim=16, query_pre_attn_scalar=16, sliding_window=8,
        attn_logit_softcapping=30.0, final_logit_softcapping=20.0)), "gemma2"),
    # 7 layers: one global layer among Gemma 3's sliding ones (every 6th)
    "gemma3": (lambda: hf.Gemma3ForCausalLM(hf.Gemma3TextConfig(
        **{**_SIZES, "num_hidden_layers": 7}, head_dim=16, query_pre_attn_scalar=16,
        sliding_window=4)), "gemma3_text"),
    "phi3": (lambda: hf.Phi3ForCausalLM(hf.Phi3Config(**_SIZES)), "phi3"),
    "granite": (lambda: hf.GraniteForCausalLM(hf.GraniteConfig(
        **_SIZES, attention_multiplier=0.3, embedding_multiplier=2.0, residual_multiplier=0.5,
        logits_scaling=4.0)), "granite"),
    # 4 layers: the 4th without rotary
    "smollm3": (lambda: hf.SmolLM3ForCausalLM(hf.SmolLM3Config(**{**_SIZES, "num_hidden_layers": 4})),
                "smollm3"),
}
KEYS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
        "num_hidden_layers", "max_position_embeddings", "vocab_size", "head_dim", "rms_norm_eps",
        "tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id", "sliding_window",
        "attn_logit_softcapping", "final_logit_softcapping", "query_pre_attn_scalar",
        "attention_multiplier", "embedding_multiplier", "residual_multiplier", "logits_scaling",
        "no_rope_layers")


def _source(arch: str) -> torch.nn.Module:
    torch.manual_seed(0)
    model = SOURCES[arch][0]().eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:  # Gemma's scale by 1 + weight
                param.uniform_(-0.5, 0.5) if arch.startswith("gemma") else param.uniform_(0.5, 1.5)
    return model


def _saved(source, folder):
    source.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("arch", sorted(SOURCES))
def test_the_metadata_gives_the_source_config(arch, tmp_path):
    source = _source(arch)
    reader = open_gguf(write_gguf(source, tmp_path / "model.gguf", arch))
    shapes = {t.name: tuple(reversed(t.shape.tolist())) for t in reader.tensors}
    config = hf_config(read_metadata(reader), shapes)
    expected = source.config.to_dict()
    assert config["model_type"] == expected["model_type"] == SOURCES[arch][1]
    rope = expected["rope_parameters"]
    assert config["rope_theta"] == rope.get("full_attention", rope)["rope_theta"]
    for key in KEYS:
        if expected.get(key) is not None:  # GGUF floats are float32: 1e-6 reads 9.99999997e-07
            assert config.get(key) == pytest.approx(expected[key], rel=1e-6), key
    if expected.get("head_dim") is None:
        assert config["head_dim"] == expected["hidden_size"] // expected["num_attention_heads"]


@pytest.mark.parametrize("arch", sorted(SOURCES))
def test_the_file_loads_equal_to_the_source(arch, tmp_path):
    source = _source(arch)
    model = tk.from_gguf(write_gguf(source, tmp_path / "model.gguf", arch))
    assert model.config == tk.config_from_hf(_saved(source, tmp_path / "source"))
    ids = torch.randint(3, 59, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = source(input_ids=ids).logits
        assert relative_error(model(ids).numpy(), expected.numpy()) <= 1e-4
