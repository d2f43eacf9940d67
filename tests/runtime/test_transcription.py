"""Transcriptions over an engine (runtime/transcription.py), on an export of Whisper tiny.en's
real weights: each window is a request whose source the encoder runs on once, the result is
OnnxModel.transcribe's, windows of several files share the batch, and what cannot run is
refused with a sentence."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import SPEECH_CLIPS
from transformer_kit.core.errors import InputError
from transformer_kit.runtime import Engine, Limits, OnnxModel, Service
from transformer_kit.runtime.transcription import TranscriptionFailed


@pytest.fixture(scope="module")
def model(whisper_tiny_en) -> OnnxModel:
    return OnnxModel(whisper_tiny_en[1], providers="cpu")


@pytest.fixture(scope="module")
def clips() -> list[Path]:
    return sorted(Path(SPEECH_CLIPS).glob("*.wav"))


def test_an_engines_transcription_is_onnx_models(model, clips):
    with Engine(model) as engine:
        service = Service(engine)
        for clip in clips[:3]:
            got = service.transcribe(clip.read_bytes(), name=clip.name).run()
            want = model.transcribe(clip)
            assert got.text == want.text
            assert [(s.start, s.end, s.tokens) for s in got.segments] == [
                (s.start, s.end, s.tokens) for s in want.segments]
        assert engine.kind == "transcribe"
        assert engine.stats.encoded == engine.stats.requests  # one encoder run per window's request


def test_windows_of_several_files_decode_together(model, clips):
    with Engine(model, start=False) as engine:
        service = Service(engine)
        jobs = [service.transcribe(clip.read_bytes()) for clip in clips[:4]]
        results: list = [None] * len(jobs)
        threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, jobs[i].run()))
                   for i in range(len(jobs))]
        for thread in threads:
            thread.start()
        while engine.queue_length < len(jobs):  # every file's first window waits
            threading.Event().wait(0.01)
        engine.start()
        for thread in threads:
            thread.join(120)
        assert engine.stats.max_batch_size == len(jobs)
        assert [r.text for r in results] == [model.transcribe(clip).text for clip in clips[:4]]


def test_a_cancelled_or_late_transcription_fails_with_its_reason(model, clips):
    with Engine(model) as engine:
        job = Service(engine).transcribe(clips[0].read_bytes())
        job.cancel()
        with pytest.raises(TranscriptionFailed) as failed:
            job.run()
        assert failed.value.failure.reason == "cancelled"
        late = Service(engine, Limits.of(448, max_request_seconds=1e-6)).transcribe(clips[0].read_bytes())
        with pytest.raises(TranscriptionFailed) as failed:
            late.run()
        assert failed.value.failure.reason == "timeout"
        assert "--max-request-seconds" in failed.value.failure.message


def test_a_cancel_ends_the_window_being_decoded(model, clips):
    with Engine(model, start=False) as engine:
        job = Service(engine).transcribe(clips[0].read_bytes())
        failures: list[TranscriptionFailed] = []

        def run() -> None:
            try:
                job.run()
            except TranscriptionFailed as failed:
                failures.append(failed)

        thread = threading.Thread(target=run)
        thread.start()
        while engine.queue_length < 1:  # the first window waits in the engine's queue
            threading.Event().wait(0.01)
        job.cancel()
        engine.start()
        thread.join(60)
        assert not thread.is_alive()
        assert [f.failure.reason for f in failures] == ["cancelled"]
        assert engine.stats.finished == {"cancelled": 1} and engine.stats.generated_tokens == 0


def test_requests_the_batch_cannot_take_are_refused(model, gpt2_text):
    features = np.zeros((1, 80, 3000), np.float32)
    with Engine(model) as engine:
        with pytest.raises(InputError, match="needs its source"):
            engine.submit([50257, 50362])
        with pytest.raises(InputError, match=r"one 30 s window's features, \(1, channels, 3000\)"):
            engine.submit([50257, 50362], source=np.zeros((1, 80, 100), np.float32))
        with pytest.raises(InputError, match="shape"):
            engine.submit([50257, 50362], source=np.zeros((1, 64, 3000), np.float32))
        with pytest.raises(InputError, match="prompt_logprobs"):
            engine.submit([50257, 50362], source=features, prompt_logprobs=1)
        with pytest.raises(InputError, match="num_beams at 1"):
            Service(engine).transcribe(b"", num_beams=2)
        with pytest.raises(InputError, match="English-only; language 'xx'"):
            Service(engine).transcribe(b"", language="xx")
    with Engine(gpt2_text[1]) as engine, pytest.raises(InputError, match="not speech windows"):
        engine.submit([1, 2], source=features)
