"""Calibrated 4-bit weights (``Int4(calibration=...)``, llama.cpp's importance matrix): each
column's squared error weighed by its mean squared input over a text. The weighted search is
checked block by block, the importance against the inputs the layers really get (in memory and
streamed from a checkpoint), the calibrated export against the float model, and the options and
their errors against the manifest and the sentences they give."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import transformer_kit as tk
from tests.combinations import tiny_config
from tests.core.decoding.test_text import byte_level_tokenizer
from transformer_kit.export import Int4, export_onnx
from transformer_kit.export.calibration import FLOOR, calibration_ids, input_importance
from transformer_kit.export.int4_nodes import search_blocks
from transformer_kit.export.quantize import DEFAULT_TOKENS
from transformer_kit.runtime import OnnxModel
from transformer_kit.tokenizer import TextTokenizer

VOCAB = 300


def _weighted_error(x, q, scale, zero, weights) -> np.ndarray:
    return (weights * (x - (q - zero[..., None]) * scale[..., None]) ** 2).sum(-1)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("symmetric", [True, False], ids=["symmetric", "asymmetric"])
def test_the_weighted_search_never_loses_to_the_plain_one_on_the_weighted_error(bits, symmetric):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((300, 4, 32)).astype(np.float32)
    weights = np.exp(rng.standard_normal((1, 4, 32)) * 2).astype(np.float32)  # a few large columns
    plain = search_blocks(x, bits, symmetric)
    weighted = search_blocks(x, bits, symmetric, weights=weights)
    before, after = _weighted_error(x, *plain, weights), _weighted_error(x, *weighted, weights)
    assert (after <= before * (1 + 1e-5) + 1e-12).all()  # block by block
    assert after.sum() < 0.9 * before.sum()
    # weights alike are the plain search
    same = search_blocks(x, bits, symmetric, weights=np.full((1, 4, 32), 3.0, np.float32))
    for a, b in zip(plain, same, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5)


def _tokenizer() -> TextTokenizer:
    return TextTokenizer({"tokenizer.json": byte_level_tokenizer().to_str().encode()})


def _decoder(**overrides) -> tk.TransformerModel:
    torch.manual_seed(0)
    config = tiny_config("decoder", vocab_size=VOCAB, d_model=64, d_ff=96, pad_id=0, tie_embeddings=True,
                         positional="rotary", norm="rmsnorm", max_len=128, **overrides)
    return tk.build_model(config).eval()


def test_the_importance_is_each_layers_mean_squared_input():
    model = _decoder()
    ids = np.random.default_rng(1).integers(0, VOCAB, 300)
    importance = input_importance(model, ids)
    seen = {}  # what each linear layer really gets, taken by a hook of the test's own

    def keep(name):
        return lambda module, args: seen.setdefault(name, []).append(args[0].reshape(-1, args[0].shape[-1]))
    handles = [m.register_forward_pre_hook(keep(n)) for n, m in model.named_modules()
               if isinstance(m, torch.nn.Linear)]
    with torch.no_grad():
        model(torch.from_numpy(ids[:128][None]), attention_mask=torch.ones(1, 128, dtype=torch.long))
        model(torch.from_numpy(ids[128:256][None]), attention_mask=torch.ones(1, 128, dtype=torch.long))
    for handle in handles:
        handle.remove()
    linear = {n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    assert {n + ".weight" for n in linear} <= set(importance)
    for name in linear:
        inputs = torch.cat(seen[name]).double()
        mean = (inputs * inputs).mean(0).numpy()  # windows of the context length (128), no tail
        np.testing.assert_allclose(importance[name + ".weight"], mean + FLOOR * mean.mean(), rtol=1e-5)
    # the tied head's importance also names the embedding table it reads
    table = next(n for n, p in model.named_parameters() if p is model.head.weight)
    np.testing.assert_array_equal(importance[table], importance["head.weight"])


def test_the_default_calibration_tokenizes_the_kits_text_or_draws_random_ids():
    model = _decoder()
    random = calibration_ids(model, "default")
    assert len(random) == DEFAULT_TOKENS and random.min() >= 0 and random.max() < VOCAB
    np.testing.assert_array_equal(random, calibration_ids(model, "default"))  # seeded
    model.tokenizer = _tokenizer()
    ids = calibration_ids(model, "default")
    assert len(ids) == DEFAULT_TOKENS
    text = (Path(tk.__file__).parent / "export" / "calibration.txt").read_text()
    assert model.tokenizer.decode(ids) == text[:len(model.tokenizer.decode(ids))]
    np.testing.assert_array_equal(calibration_ids(model, "a few words"),
                                  model.tokenizer.encode(["a few words"], False)[0][0])


def _outlier_decoder() -> tk.TransformerModel:
    """A decoder whose norms make 4 of 64 hidden channels 8 times larger, as trained models'
    outlier channels are: their columns' rounding errors weigh most."""
    model = _decoder()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param[:4] *= 8
    return model


def test_a_calibrated_export_is_closer_to_the_float_model(tmp_path):
    model = _outlier_decoder()
    ids = torch.from_numpy(np.random.default_rng(2).integers(0, VOCAB, (4, 48)))
    with torch.no_grad():
        expected = model(ids).numpy()
    errors = {}
    for name, calibration in (("plain", None), ("default", "default")):
        quantize = Int4(block_size=16, accuracy_level=1, eight_bit=(), calibration=calibration)
        export_onnx(model, tmp_path / name, quantize=quantize, verify=False)
        logits = OnnxModel(tmp_path / name, providers="cpu")(ids.numpy())
        errors[name] = float(np.sqrt(((logits - expected) ** 2).mean()))
    assert errors["default"] < 0.8 * errors["plain"], errors
    options = OnnxModel(tmp_path / "default").manifest.quantization_options
    assert options["calibration"] == "default (512 tokens)"
    assert OnnxModel(tmp_path / "plain").manifest.quantization_options["calibration"] is None


def test_the_manifest_names_the_calibration_without_its_text(tmp_path):
    model = _decoder()
    model.tokenizer = _tokenizer()
    text = "the quick brown fox jumps over the lazy dog " * 40
    export_onnx(model, tmp_path / "text", quantize=Int4(block_size=16, calibration=text), verify=False)
    described = OnnxModel(tmp_path / "text").manifest.quantization_options["calibration"]
    assert described.startswith(f"text of {len(text)} characters (sha256 ") and text not in described
    file = tmp_path / "calibration.txt"
    file.write_text(text)
    assert Int4(calibration=file).describe()["calibration"] == "file calibration.txt"
    np.testing.assert_array_equal(calibration_ids(model, file), calibration_ids(model, text))
    assert Int4(calibration=np.array([5, 6, 7] * 50)).describe()["calibration"] == "150 token ids"


@pytest.mark.parametrize(("calibration", "options", "words"), [
    ("", {}, "calibration text is empty"),
    (Path("/nonexistent/calibration.txt"), {}, "does not exist or is not a file"),
    ("some text", {"rounding": "nearest"}, "rounding='nearest' does not search"),
    (3.5, {}, "is not supported; give 'default', a string of text"),
    ([1, True], {}, "is not supported"),
])
def test_bad_calibrations_are_refused_with_a_sentence(calibration, options, words):
    with pytest.raises(tk.InputError, match=words):
        Int4(calibration=calibration, **options)


def test_what_the_model_cannot_read_is_refused_at_export(tmp_path):
    model = _decoder()  # no tokenizer
    with pytest.raises(tk.InputError, match="needs the model's tokenizer"):
        export_onnx(model, tmp_path / "a", quantize=Int4(calibration="some text"), verify=False)
    with pytest.raises(tk.InputError, match=rf"ids in 0\.\.{VOCAB - 1}"):
        export_onnx(model, tmp_path / "b", quantize=Int4(calibration=[1, 2, VOCAB]), verify=False)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    assert Int4(rounding="nearest").calibration is None  # the default means none there


def test_a_speech_model_is_not_calibrated_on_made_up_features(tmp_path):
    from tests.plugins.families.test_whisper import random_whisper

    random_whisper(32, 2, 1, 1).save_pretrained(tmp_path / "hf")
    model = tk.from_hf(tmp_path / "hf")
    export_onnx(model, tmp_path / "int4", quantize=Int4(block_size=16), verify=False)
    assert OnnxModel(tmp_path / "int4").manifest.quantization_options["calibration"] is None
    with pytest.raises(tk.InputError, match="reads audio features"):
        export_onnx(model, tmp_path / "text", quantize=Int4(calibration=(1, 2, 3)), verify=False)
    assert not (tmp_path / "text").exists()
