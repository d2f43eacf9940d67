"""from_hf as a whole: weights-only .bin files, refusals naming what is wrong, special ids that
name no token, and checkpoint families contributed by a third-party package."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers as hf

import transformer_kit as tk
from tests.plugins.families.parity import VOCAB, check_generation
from transformer_kit.export import export_onnx
from transformer_kit.export.verify import relative_error
from transformer_kit.runtime import OnnxModel


def _llama(**extra):
    return hf.LlamaForCausalLM(hf.LlamaConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=38, num_attention_heads=4,
        num_key_value_heads=2, num_hidden_layers=1, max_position_embeddings=64, bos_token_id=1,
        eos_token_id=2, **extra))


def test_pytorch_bin_checkpoints_load_with_weights_only(tmp_path):
    torch.manual_seed(0)
    reference = _llama().eval()
    reference.config.save_pretrained(tmp_path)
    torch.save(reference.state_dict(), tmp_path / "pytorch_model.bin")  # the pre-safetensors layout
    model = tk.from_hf(tmp_path)
    ids = torch.randint(3, VOCAB, (2, 5))
    with torch.no_grad():
        assert relative_error(model(ids), reference(input_ids=ids).logits) <= 1e-4


def test_unsupported_missing_and_broken_checkpoints(tmp_path):
    gptj = tmp_path / "gptj"
    hf.GPTJConfig(vocab_size=10, n_embd=8, n_layer=1, n_head=2, rotary_dim=2).save_pretrained(gptj)
    supported = ", ".join(tk.get_registry().model_types())  # the list itself: test_registry.py
    with pytest.raises(tk.CheckpointError, match=rf"model_type 'gptj'.*Supported: {supported}"):
        tk.from_hf(gptj)
    with pytest.raises(tk.CheckpointError, match=r"'.*nothing' does not exist"):
        tk.from_hf(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(tk.CheckpointError, match=r"config.json is missing"):
        tk.from_hf(tmp_path / "empty")
    gpt2 = tmp_path / "gpt2"
    hf.GPT2LMHeadModel(hf.GPT2Config(vocab_size=VOCAB, n_positions=8, n_embd=8, n_layer=1, n_head=2,
                                     bos_token_id=1, eos_token_id=2)).save_pretrained(gpt2)
    (gpt2 / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(tk.CheckpointError, match=r"Cannot read the weights"):
        tk.from_hf(gpt2)
    (gpt2 / "model.safetensors").unlink()
    with pytest.raises(tk.CheckpointError, match=r"has no weights"):
        tk.from_hf(gpt2)


def test_special_ids_outside_the_vocabulary_load_as_null_like_transformers(tmp_path):
    torch.manual_seed(0)
    reference = hf.GPT2LMHeadModel(hf.GPT2Config(vocab_size=1000, n_positions=32, n_embd=16,
                                                 n_layer=1, n_head=2)).eval()  # bos, eos 50256
    reference.save_pretrained(tmp_path)
    with pytest.warns(UserWarning, match=r"bos_id 50256 and eos_id 50256, outside the vocabulary \(0"):
        model = tk.from_hf(tmp_path)
    assert (model.config.bos_id, model.config.eos_id, model.config.pad_id) == (None, None, None)
    ids = torch.randint(0, 1000, (1, 5), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = reference.generate(ids, do_sample=False, max_new_tokens=8, pad_token_id=0,
                                      attention_mask=torch.ones_like(ids))[:, 5:]
    assert torch.equal(model.generate(ids, 8), expected)  # never stops early, as transformers
    chosen = tk.from_hf(tmp_path, eos_id=7, bos_id=None)
    assert (chosen.config.bos_id, chosen.config.eos_id) == (None, 7)


DOCS = Path(__file__).parent.parent.parent / "docs" / "plugins.md"


def _opt_family_source() -> str:
    """The third-party family module written in docs/plugins.md, as a user would copy it."""
    blocks = re.findall(r"```python\n(.*?)```", DOCS.read_text(), flags=re.S)
    return next(b for b in blocks if b.startswith("# my_opt_family.py"))


def test_a_third_party_package_adds_a_family_through_its_entry_point(installed_package, fresh_registry,
                                                                      tmp_path):
    torch.manual_seed(0)
    reference = hf.OPTForCausalLM(hf.OPTConfig(
        vocab_size=VOCAB, hidden_size=16, num_attention_heads=4, num_hidden_layers=2, ffn_dim=40,
        max_position_embeddings=32, pad_token_id=VOCAB - 1, bos_token_id=1, eos_token_id=2,
        word_embed_proj_dim=16)).eval()
    reference.save_pretrained(tmp_path / "opt")
    with pytest.raises(tk.CheckpointError, match=r"model_type 'opt'"):
        tk.from_hf(tmp_path / "opt")
    installed_package("tk-opt-family", "tkplugin_opt", _opt_family_source())
    registry = tk.reset_registry()
    entry = registry.family("opt")
    assert (entry.plugin, entry.distribution) == ("tkplugin_opt", "tk-opt-family")
    model = tk.from_hf(tmp_path / "opt")
    ids = torch.randint(3, VOCAB - 2, (3, 7), generator=torch.Generator().manual_seed(2))
    ids[1, 5:] = VOCAB - 1  # right padding
    mask = (ids != VOCAB - 1).long()
    with torch.no_grad():
        expected = reference(input_ids=ids, attention_mask=mask).logits
        ours = model(ids)
    real = mask.bool()
    assert relative_error(ours[real], expected[real]) <= 1e-4
    export_onnx(model, tmp_path / "onnx")
    om = OnnxModel(tmp_path / "onnx")
    assert relative_error(om(ids.numpy())[real.numpy()], expected[real].numpy()) <= 1e-4
    check_generation(reference, model, om)


def test_two_plugins_with_the_same_family_name_both_plugins(installed_package, fresh_registry):
    installed_package("tk-gpt2-again", "tkplugin_gpt2_again", '''
        import transformer_kit as tk

        @tk.hookimpl
        def transformer_kit_checkpoint_families():
            return [tk.CheckpointFamily("gpt2", dict, dict, probe="wte.weight")]
    ''')
    with pytest.warns(RuntimeWarning):
        registry = tk.reset_registry()
    failure = next(f for f in registry.failures if f.plugin == "tkplugin_gpt2_again")
    assert "checkpoint family 'gpt2' is provided by both plugin 'builtin'" in failure.error
    assert "distribution 'tk-gpt2-again'" in failure.error
    assert registry.family("gpt2").plugin == "builtin"
    np.testing.assert_equal(registry.model_types(),
                            ["bart", "bert", "gemma", "gemma2", "gemma3", "gemma3_text", "gpt2", "gpt_neox",
                             "gpt_oss", "granite", "granitemoe", "granitemoeshared", "llama", "marian",
                             "mistral", "mixtral", "olmo2", "olmoe", "phi3",
                             "qwen2", "qwen2_moe", "qwen3", "qwen3_moe",
                             "roberta", "smollm3", "t5", "whisper", "xlm-roberta"])
