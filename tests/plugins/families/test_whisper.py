"""The whisper family: random WhisperForConditionalGeneration checkpoints in the tiny, base and
large-v3 layouts (reduced widths and depths; large-v3's 128 mel bins) equal transformers in
PyTorch and onnxruntime: the log-mel features, the encoder's outputs, the logits, and greedy and
beam-search tokens after Whisper's prompt with its suppressed tokens."""

from __future__ import annotations

import json
import shutil
from typing import ClassVar

import numpy as np
import pytest
import torch
import transformers as hf

import transformer_kit as tk
from tests.plugins.families import parity
from transformer_kit.core.errors import InputError
from transformer_kit.export import export_onnx
from transformer_kit.export.verify import relative_error
from transformer_kit.runtime import OnnxModel

TOLERANCE = 1e-4
#: Whisper's 30 s window at 16 kHz.
WINDOW = 480_000
#: The multilingual vocabulary's start of transcript, <|en|>, <|transcribe|>, <|notimestamps|>.
PROMPT = [50258, 50259, 50360, 50364]
#: transformers' defaults for Whisper's suppressed tokens (a few of them) and begin-suppressed ones.
SUPPRESS, BEGIN_SUPPRESS = [1, 2, 7, 8, 9, 10, 14, 25, 50358, 50359, 50361], [220, 50257]


def random_whisper(d_model, heads, enc, dec, mels=80, vocab=51865):
    """A random WhisperForConditionalGeneration of this shape (Whisper's special ids, random norms)."""
    config = hf.WhisperConfig(
        vocab_size=vocab, num_mel_bins=mels, d_model=d_model, encoder_attention_heads=heads,
        decoder_attention_heads=heads, encoder_layers=enc, decoder_layers=dec,
        encoder_ffn_dim=2 * d_model, decoder_ffn_dim=2 * d_model, init_std=0.2,
        pad_token_id=50257, bos_token_id=50257, eos_token_id=50257, decoder_start_token_id=50258)
    return parity.random_norms(hf.WhisperForConditionalGeneration(config))


def audio(rows: int, seed: int = 0) -> np.ndarray:
    """(rows, 30 s) float32: a few seconds of tones in noise each (a different length per row),
    then silence, as the feature extractor pads."""
    rng = np.random.default_rng(seed)
    out = np.zeros((rows, WINDOW), np.float32)
    for row in range(rows):
        length = 16000 * (3 + 2 * row)
        t = np.arange(length) / 16000
        tone = 0.2 * np.sin(2 * np.pi * (220 + 110 * row) * t) * np.sin(2 * np.pi * 2 * t)
        out[row, :length] = tone + 0.02 * rng.standard_normal(length)
    return out


def reference_features(reference_folder, samples: np.ndarray) -> np.ndarray:
    extractor = hf.WhisperFeatureExtractor(feature_size=hf.WhisperConfig.from_pretrained(
        reference_folder).num_mel_bins)
    return extractor(list(samples), sampling_rate=16000, return_tensors="np").input_features


def reference_tokens(reference, features: torch.Tensor, **options) -> np.ndarray:
    """transformers' generation after Whisper's prompt, with its suppressed tokens (the generic
    ``generate``: random checkpoints carry none of Whisper's generation settings)."""
    gen = hf.GenerationConfig(do_sample=False, max_new_tokens=10, pad_token_id=50257,
                              eos_token_id=50257, decoder_start_token_id=50258,
                              suppress_tokens=SUPPRESS, begin_suppress_tokens=BEGIN_SUPPRESS, **options)
    prompt = torch.tensor([PROMPT] * len(features))
    with torch.no_grad():
        out = hf.GenerationMixin.generate(reference, input_features=features,
                                          decoder_input_ids=prompt, generation_config=gen)
    return parity.after_eos(out[:, len(PROMPT):].numpy(), [50257], 50257)


PROCESSORS = [{"name": "suppress_tokens", "token_ids": SUPPRESS},
              {"name": "suppress_at_begin", "token_ids": BEGIN_SUPPRESS}]


class TestWhisper:
    CHECKPOINTS: ClassVar = {
        "whisper-tiny-2+2layers": lambda: random_whisper(64, 4, 2, 2),
        "whisper-base-3+1layers": lambda: random_whisper(64, 8, 3, 1),
        "whisper-large-v3-2+2layers-128mels": lambda: random_whisper(64, 2, 2, 2, mels=128, vocab=51866),
    }

    def test_features_encoder_and_logits_equal_transformers_in_pytorch(self, checkpoint):
        reference, model, folder = checkpoint
        samples = audio(2)
        expected = reference_features(folder, samples)
        with torch.no_grad():
            features = model.audio_features(torch.from_numpy(samples))
            assert relative_error(features.numpy(), expected) <= TOLERANCE
            memory, _ = model.encode(features)
            encoded = reference.model.encoder(features).last_hidden_state
            assert relative_error(memory.numpy(), encoded.numpy()) <= TOLERANCE
            tgt = torch.tensor([[*PROMPT, 440, 1000, 30]] * 2)
            logits = reference(input_features=features, decoder_input_ids=tgt).logits
            assert relative_error(model(features, tgt).numpy(), logits.numpy()) <= TOLERANCE

    def test_features_logits_and_tokens_equal_transformers_in_onnxruntime(self, checkpoint, tmp_path):
        reference, model, folder = checkpoint
        report = export_onnx(model, tmp_path / "onnx")
        assert report.max_error <= max(TOLERANCE, report.tolerance)
        om = OnnxModel(tmp_path / "onnx", providers="cpu")
        samples = audio(2, seed=1)
        features = om.audio_features(samples)
        assert relative_error(features, reference_features(folder, samples)) <= TOLERANCE
        tgt = np.array([[*PROMPT, 440, 1000, 30]] * 2)
        with torch.no_grad():
            logits = reference(input_features=torch.from_numpy(features),
                               decoder_input_ids=torch.from_numpy(tgt)).logits.numpy()
        assert relative_error(om(features, tgt), logits) <= TOLERANCE
        # no token twice: a random model's greedy choice would otherwise repeat one token
        for options in ({"num_beams": 1, "no_repeat_ngram_size": 1},
                        {"num_beams": 3, "num_return_sequences": 2, "no_repeat_ngram_size": 1}):
            expected = reference_tokens(reference, torch.from_numpy(features), **options)
            ours = om.generate(features, 10, decoder_input_ids=np.array(PROMPT),
                               logits_processors=PROCESSORS, **options)
            np.testing.assert_array_equal(ours[:, :expected.shape[1]], expected, err_msg=str(options))
            torch_ours = model.generate(torch.from_numpy(features), 10,
                                        decoder_input_ids=torch.tensor(PROMPT),
                                        logits_processors=PROCESSORS, **options).numpy()
            np.testing.assert_array_equal(torch_ours, ours, err_msg=str(options))

    def test_bad_samples_are_refused_alike_in_both_runtimes(self, checkpoint, tmp_path):
        _, model, _ = checkpoint
        export_onnx(model, tmp_path / "onnx", verify=False)
        om = OnnxModel(tmp_path / "onnx", providers="cpu")
        nan = audio(1)
        nan[0, 5] = np.nan
        for bad, says in ((np.zeros((1, 0), np.float32), "n_samples >= 1"),
                          (np.zeros((1, 2, 3), np.float32), "n_samples"),
                          (nan, "NaN or infinite")):
            with pytest.raises(InputError, match=says):
                om.audio_features(bad)
            with pytest.raises(InputError, match=says):
                model.audio_features(torch.from_numpy(bad))
        with pytest.raises(InputError, match="float tensor"):
            model.audio_features(torch.zeros((1, 100), dtype=torch.int64))
        single = audio(1)[0]  # (n,) is one row, in both
        np.testing.assert_allclose(model.audio_features(torch.from_numpy(single)).numpy(),
                                   om.audio_features(single), atol=1e-4)

    def test_config_and_weights_survive_save_and_load(self, checkpoint, tmp_path):
        _, model, folder = checkpoint
        assert tk.config_from_hf(folder) == model.config
        model.save(tmp_path / "saved")
        loaded = tk.load_model(tmp_path / "saved").eval()
        features = model.audio_features(torch.from_numpy(audio(1)))
        tgt = torch.tensor([PROMPT])
        with torch.no_grad():
            assert torch.equal(loaded(features, tgt), model(features, tgt))


# -- transcription: Whisper's prompt, rules and windows on a random multilingual checkpoint -------
LANGUAGES = ["en", "zh", "de", "es", "ru", "ko", "fr", "ja", "pt", "tr"]  # the first of Whisper's 99


@pytest.fixture(scope="module")
def multilingual(tmp_path_factory):
    """A random multilingual Whisper checkpoint with Whisper's generation config and a
    tokenizer of its layout: (transformers' model, the kit's model, the kit's export)."""
    from testbed.whisper_ct2 import multilingual_tokenizer, tiny_en_ct2

    try:
        english = tiny_en_ct2() / "tokenizer.json"
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    folder = tmp_path_factory.mktemp("whisper-multilingual")
    torch.manual_seed(7)
    reference = random_whisper(64, 4, 2, 2).eval()
    reference.save_pretrained(folder)
    ids = multilingual_tokenizer(english, folder / "tokenizer.json")
    generation = {
        "decoder_start_token_id": 50258, "eos_token_id": 50257, "pad_token_id": 50257,
        "bos_token_id": 50257, "no_timestamps_token_id": 50363, "prev_sot_token_id": 50361,
        "is_multilingual": True, "max_initial_timestamp_index": 50, "max_length": 448,
        "suppress_tokens": SUPPRESS, "begin_suppress_tokens": BEGIN_SUPPRESS,
        "lang_to_id": {f"<|{code}|>": ids[f"<|{code}|>"] for code in LANGUAGES},
        "task_to_id": {"transcribe": 50359, "translate": 50358},
        "alignment_heads": [[1, 0], [1, 2]],
    }
    (folder / "generation_config.json").write_text(json.dumps(generation))
    reference = hf.WhisperForConditionalGeneration.from_pretrained(folder).eval()
    model = tk.from_hf(folder)
    export = folder / "onnx"
    export_onnx(model, export)
    return reference, model, OnnxModel(export, providers="cpu")


def _hf_segments(reference, features: np.ndarray, **options) -> list[tuple]:
    with torch.no_grad():
        out = reference.generate(torch.from_numpy(features), return_timestamps=True,
                                 return_segments=True, max_new_tokens=12, **options)
    return [(round(float(s["start"]), 2), round(float(s["end"]), 2), s["tokens"].tolist())
            for s in out["segments"][0]]


def _segments(result) -> list[tuple]:
    return [(round(s.start, 2), round(s.end, 2), s.tokens) for s in result.segments]


GREEDY = {"temperature": 0.0, "compression_ratio_threshold": None, "logprob_threshold": None,
          "max_new_tokens": 12}


@pytest.mark.parametrize(("language", "task"), [("de", "translate"), ("fr", "transcribe")])
def test_language_and_task_prompts_equal_transformers(multilingual, language, task):
    reference, model, om = multilingual
    samples = audio(1, seed=3)[0]
    features = om.audio_features(samples[None])
    expected = _hf_segments(reference, features, language=language, task=task)
    assert _segments(om.transcribe(samples, language=language, task=task, **GREEDY)) == expected
    assert _segments(model.transcribe(samples, language=language, task=task, **GREEDY)) == expected


def test_detected_language_equals_transformers(multilingual):
    reference, model, om = multilingual
    samples = audio(1, seed=4)[0]
    features = om.audio_features(samples[None])
    with torch.no_grad():
        detected = reference.detect_language(torch.from_numpy(features))[0].item()
    code = next(c for c in LANGUAGES if reference.generation_config.lang_to_id[f"<|{c}|>"] == detected)
    result = om.transcribe(samples, **GREEDY)
    assert result.language == code == model.transcribe(samples, **GREEDY).language
    assert _segments(result) == _hf_segments(reference, features, language=code)


def test_beam_search_equals_transformers(multilingual):
    reference, model, om = multilingual
    samples = audio(1, seed=5)[0]
    features = om.audio_features(samples[None])
    expected = _hf_segments(reference, features, language="en", num_beams=2)
    assert _segments(om.transcribe(samples, language="en", num_beams=2, **GREEDY)) == expected
    assert _segments(model.transcribe(samples, language="en", num_beams=2, **GREEDY)) == expected


@pytest.mark.parametrize("timestamps", [True, False])
def test_token_times_equal_transformers(multilingual, timestamps):
    """Word timestamps' token times (the alignment heads' cross attention, time-warped) equal
    transformers' ``return_token_timestamps`` in both runtimes; real speech and its words:
    tests/plugins/families/test_whisper_tiny_en.py."""
    reference, model, om = multilingual
    samples = audio(1, seed=6)[0]
    features = om.audio_features(samples[None])
    with torch.no_grad():
        out = reference.generate(torch.from_numpy(features), language="en", return_timestamps=timestamps,
                                 return_segments=timestamps, return_token_timestamps=True,
                                 max_new_tokens=12)
    expected = ([s["token_timestamps"].numpy() for s in out["segments"][0]] if timestamps
                else [out["token_timestamps"][0].numpy()])
    for runner in (om, model):
        result = runner.transcribe(samples, language="en", timestamps=timestamps,
                                   word_timestamps=True, **GREEDY)
        assert len(result.segments) == len(expected)
        for segment, times in zip(result.segments, expected, strict=True):
            np.testing.assert_allclose(segment.token_times, times, atol=0.02 + 1e-6)
        assert [w for s in result.segments for w in s.words] == result.words


def test_word_timestamps_are_refused_where_they_cannot_be_read(multilingual, tmp_path):
    _, model, om = multilingual
    samples = audio(1)[0]
    with pytest.raises(InputError, match="word_timestamps must be true or false"):
        om.transcribe(samples, word_timestamps="yes")
    # an export from before the alignment graph
    old = tmp_path / "old"
    shutil.copytree(om.path, old)
    manifest = json.loads((old / "manifest.json").read_text())
    del manifest["graphs"]["alignment"]
    (old / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(InputError, match=r"no alignment graph.*Export it again"):
        OnnxModel(old, providers="cpu").transcribe(samples, word_timestamps=True)
    # a config naming no alignment heads: no alignment graph either, and a sentence
    model.save(tmp_path / "saved")
    config = json.loads((tmp_path / "saved" / "config.json").read_text())
    config["config"]["speech"]["alignment_heads"] = []
    (tmp_path / "saved" / "config.json").write_text(json.dumps(config))
    headless = tk.load_model(tmp_path / "saved")
    export_onnx(headless, tmp_path / "headless", verify=False)
    assert "alignment" not in OnnxModel(tmp_path / "headless", providers="cpu").manifest.graphs
    for runner in (headless, OnnxModel(tmp_path / "headless", providers="cpu")):
        with pytest.raises(InputError, match="alignment heads"):
            runner.transcribe(samples, word_timestamps=True)
