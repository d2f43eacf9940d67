"""Adversarial inputs to the core: every config key with a wrong type, sizes out of range, ids
outside the vocabulary, empty batches, faulty plugins shipped in their own distributions, and
unsafe or damaged checkpoint files. Each case is listed in RELIABILITY.md."""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import pytest
import torch

import transformer_kit as tk
from tests.combinations import tiny_config
from transformer_kit.core.config import ModelConfig

ROOT = Path(__file__).parent.parent.parent

# a wrong value of another type for every key (strict mode: no coercion)
WRONG_TYPES = {
    "architecture": 3, "vocab_size": "37", "src_vocab_size": 1.5, "tgt_vocab_size": [37],
    "d_model": 16.0, "num_heads": "4", "num_kv_heads": 2.0, "head_dim": "4", "num_layers": True,
    "encoder_layers": "2", "decoder_layers": 2.5, "d_ff": None, "dropout": "0.1",
    "max_len": 64.0, "pad_id": "0", "bos_id": 1.0, "eos_id": [2.0], "tie_embeddings": "yes",
    "scale_embeddings": 1, "attention_bias": "true", "attention_out_bias": "false",
    "forced_bos_id": "0", "embedding_norm": 0, "head_bias": None,
    "lm_head": "no", "attention": 5, "positional": 1.5, "mask": ["causal"], "block": True,
    "feedforward": {"params": {}}, "norm": 0, "qk_norm": 7, "embedding_scale": "12",
    "logit_scale": [0.5], "logit_softcap": True, "layer_types": "local",
    "layer_variants": ["local"], "pooling": 3, "sentence_embedding": "mean",
    "classifier": 1, "max_seq_length": "256", "lowercase": "yes", "frontend": 2,
    "features": ["log_mel"], "encoder_positional": 0.5, "speech": "whisper",
}
SIZES = ["vocab_size", "d_model", "num_heads", "num_kv_heads", "num_layers", "d_ff", "max_len"]


def test_every_config_key_is_covered_by_the_wrong_type_cases():
    assert set(WRONG_TYPES) == set(ModelConfig.model_fields)


@pytest.mark.parametrize(("key", "value"), WRONG_TYPES.items(), ids=list(WRONG_TYPES))
def test_a_wrong_type_for_any_key_names_the_key_and_the_value(key, value):
    with pytest.raises(tk.ConfigError, match=re.escape(key)) as info:
        tk.build_model({**tiny_config("encoder_decoder"), key: value})
    assert "Traceback" not in str(info.value)


@pytest.mark.parametrize("value", [0, -1, -512])
@pytest.mark.parametrize("key", SIZES)
def test_zero_and_negative_sizes_are_refused(key, value):
    with pytest.raises(tk.ConfigError, match=rf"{key}.*greater than 0"):
        tk.build_model(tiny_config("decoder", **{key: value}))


@pytest.mark.parametrize(("overrides", "expected"), [
    ({"pad_id": 37}, r"'pad_id' \(37\) must be below the vocabulary size \(37\)"),
    ({"bos_id": 40}, r"'bos_id' \(40\) must be below the vocabulary size \(37\)"),
    ({"eos_id": 37}, r"'eos_id' \(37\) must be below"),
    ({"pad_id": -1}, r"pad_id.*greater than or equal to 0"),
    ({"bos_id": -3}, r"bos_id.*greater than or equal to 0"),
])
def test_ids_outside_the_vocabulary_are_refused(overrides, expected):
    with pytest.raises(tk.ConfigError, match=expected):
        tk.build_model(tiny_config("decoder", **overrides))


def test_pad_id_must_fit_both_vocabularies_when_they_differ():
    config = tiny_config("encoder_decoder", vocab_size=None, src_vocab_size=50, tgt_vocab_size=20,
                         pad_id=30)
    with pytest.raises(tk.ConfigError, match=r"'pad_id' \(30\) must be below the vocabulary size \(20\)"):
        tk.build_model(config)


@pytest.mark.parametrize("dropout", [1.0, 1.5, -0.1, float("nan"), float("inf")])
def test_dropout_outside_zero_to_one_is_refused(dropout):
    with pytest.raises(tk.ConfigError, match="dropout"):
        tk.build_model(tiny_config("decoder", dropout=dropout))


def test_empty_batches_and_bool_ids_are_refused_in_pytorch():
    model = tk.build_model(tiny_config("decoder", pad_id=0)).eval()
    with pytest.raises(tk.InputError, match=r"input_ids is empty \(shape \(0, 3\)\)"):
        model(torch.zeros(0, 3, dtype=torch.long))
    with pytest.raises(tk.InputError, match=r"input_ids is empty"):
        model.generate(torch.zeros(0, 3, dtype=torch.long), 2)
    with pytest.raises(tk.InputError, match=r"integer token ids, got dtype torch.bool"):
        model(torch.ones(1, 3, dtype=torch.bool))


# -- plugins shipped in their own distributions --------------------------------------------------
FAULTY = {
    "tk-raising-hook": ("tkplugin_raising_hook", """
        import transformer_kit as tk

        @tk.hookimpl
        def transformer_kit_components():
            raise RuntimeError("hook exploded")
    """),
    "tk-raising-factory": ("tkplugin_raising_factory", """
        import transformer_kit as tk

        def factory(d_model):
            raise RuntimeError("no accelerator")

        @tk.hookimpl
        def transformer_kit_components():
            return [tk.Component("feedforward", "explosive", factory)]
    """),
    "tk-wrong-type": ("tkplugin_wrong_type", """
        import transformer_kit as tk

        @tk.hookimpl
        def transformer_kit_components():
            return [tk.Component("feedforward", "bogus", lambda: 42)]
    """),
}


def test_faulty_plugin_packages_are_named_with_their_distribution(installed_package, fresh_registry):
    for dist, (module, source) in FAULTY.items():
        installed_package(dist, module, source)
    with pytest.warns(RuntimeWarning, match="tk-raising-hook"):
        registry = tk.reset_registry()
    failures = {f.plugin: f for f in registry.failures}
    assert failures["tkplugin_raising_hook"].distribution == "tk-raising-hook"
    assert "hook exploded" in failures["tkplugin_raising_hook"].error
    with pytest.raises(tk.ComponentError, match=r"no accelerator") as raised:
        tk.build_model(tiny_config("decoder", feedforward="explosive"))
    assert "plugin 'tkplugin_raising_factory' (distribution 'tk-raising-factory')" in str(raised.value)
    with pytest.raises(tk.ComponentError, match=r"returned int") as wrong:
        tk.build_model(tiny_config("decoder", feedforward="bogus"))
    assert "plugin 'tkplugin_wrong_type' (distribution 'tk-wrong-type')" in str(wrong.value)
    # the kit keeps working with the rest
    model = tk.build_model(tiny_config("decoder")).eval()
    assert model.generate(torch.tensor([[3, 4]]), 2).shape == (1, 2)


# -- files -------------------------------------------------------------------------------------
def _gpt2_checkpoint(folder: Path) -> Path:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=31, n_positions=16, n_embd=8, n_head=2, n_layer=1,
                                     bos_token_id=1, eos_token_id=2)
    transformers.GPT2LMHeadModel(config).save_pretrained(folder)
    return folder


class _Payload:
    """Unpickling this runs code; torch.load(weights_only=True) must refuse it."""

    def __reduce__(self):
        return (print, ("this must never run",))


def test_a_pickle_with_code_in_it_is_refused_not_run(tmp_path, capsys):
    folder = _gpt2_checkpoint(tmp_path / "ckpt")
    (folder / "model.safetensors").unlink()
    tensors = {"transformer.wte.weight": torch.zeros(31, 8), "evil": _Payload()}
    with open(folder / "pytorch_model.bin", "wb") as handle:
        pickle.dump(tensors, handle, protocol=2)
    with pytest.raises(tk.TransformerKitError, match=r"Cannot read the weights"):
        tk.from_hf(folder)
    assert "this must never run" not in capsys.readouterr().out


def test_torch_load_is_only_ever_called_with_weights_only():
    calls = []
    for path in ROOT.glob("transformer_kit/**/*.py"):  # core, plugins, export and applications
        text = path.read_text()
        for match in re.finditer(r"torch\.load\(([^)]*)\)", text):
            calls.append((path.name, match.group(1)))
    assert calls, "the checkpoint reader uses torch.load for .bin files"
    assert all("weights_only=True" in args for _, args in calls), calls


def test_a_checkpoint_whose_tensors_disagree_with_its_config_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    folder = _gpt2_checkpoint(tmp_path / "ckpt")
    tensors = load_file(folder / "model.safetensors")
    tensors["transformer.h.0.mlp.c_fc.weight"] = torch.zeros(8, 7)
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(tk.TransformerKitError, match=r"has shape \(7, 8\).*expects \(32, 8\)"):
        tk.from_hf(folder)


def test_a_corrupt_weights_file_of_a_saved_model_is_a_typed_error(tmp_path):
    model = tk.build_model(tiny_config("decoder"))
    folder = model.save(tmp_path / "saved")
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 3])
    with pytest.raises(tk.TransformerKitError, match=r"model.safetensors"):
        tk.load_model(folder)
    weights.write_bytes(b"\x00" * 64)
    with pytest.raises(tk.TransformerKitError, match=r"model.safetensors"):
        tk.load_model(folder)
