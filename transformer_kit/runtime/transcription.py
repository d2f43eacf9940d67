"""Speech to text over an engine: Whisper's pipeline (:class:`~transformer_kit.core.speech.Transcriber`)
whose windows decode in the engine's continuous batch, so that the windows of many callers'
files run their decoder steps together.

A transcription runs in its caller's thread: the audio's features are computed there, and each
window (and each fallback at a higher temperature) is a request to the engine, its window's
features the source the encoder runs on once, its decoder prompt Whisper's. The caller waits for
each window's tokens, so a file's windows follow each other while other files' windows share
the batch. A transcription has one time bound in all (the service's ``max_request_seconds``)
and stops at the engine's next step when its caller cancels it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from transformer_kit.core.errors import InputError
from transformer_kit.core.speech import (
    Segment,
    TranscribeOptions,
    Transcriber,
    Transcription,
    load_audio,
    transcribe_options,
)
from transformer_kit.core.speech_config import SAMPLING_RATE, SpeechConfig
from transformer_kit.runtime.engine import Engine
from transformer_kit.runtime.requests import Failure, GenerationRequest


class TranscriptionFailed(Exception):
    """A transcription ended without its answer: ``failure`` says why (past its time, a failed
    step, or ``"cancelled"``: its caller left or the engine closed)."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.message)
        self.failure = failure


class EngineWindows:
    """The Transcriber's ``generate`` as requests to ``engine``: one request per call (a
    window's decoder prompt, its features as the source), waited for; each token's log
    probability from the scores it was chosen from. A call raises :class:`TranscriptionFailed`
    past ``deadline`` (a ``time.perf_counter()`` value; None: no bound) or once :meth:`cancel`
    has been called, which also ends the window being decoded at the engine's next step."""

    def __init__(self, engine: Engine, deadline: float | None) -> None:
        self.engine, self.deadline = engine, deadline
        self.cancelled = False
        self.current: GenerationRequest | None = None
        self.lock = threading.Lock()  # between a window's submission and a cancel from elsewhere

    def __call__(self, features: np.ndarray, steps: int, prompt: np.ndarray, **options: Any
                 ) -> tuple[np.ndarray, list[list[float]] | None]:
        left = None if self.deadline is None else self.deadline - time.perf_counter()
        with self.lock:
            if self.cancelled:
                raise TranscriptionFailed(Failure("cancelled", "The transcription was cancelled."))
            if left is not None and left <= 0:
                raise TranscriptionFailed(_past_time())
            request = self.engine.submit(prompt[0], source=features, timeout=left,
                                         max_new_tokens=steps, logprobs=0,
                                         logprobs_mode="processed", **options)
            self.current = request
        request.wait()
        _check_ended(request)
        return (np.array([request.tokens], np.int64),
                [[report.logprob for report in request.logprobs]])

    def cancel(self) -> None:
        """Stop: the window being decoded ends at the engine's next step, no other starts."""
        with self.lock:
            self.cancelled = True
            if self.current is not None:
                self.current.cancel()


def _past_time() -> Failure:
    return Failure("timeout", "The transcription ran longer than its limit (the server's "
                   "--max-request-seconds); send a shorter file, or retry when the server is "
                   "less busy.")


def _check_ended(request: GenerationRequest) -> None:
    if request.finish_reason == "timeout":
        raise TranscriptionFailed(_past_time())
    if request.finish_reason == "cancelled":
        raise TranscriptionFailed(Failure("cancelled", "The transcription was cancelled (its "
                                          "client left, or the server stopped)."))
    if (failure := request.failure) is not None:
        raise TranscriptionFailed(failure)


@dataclass
class Transcribing:
    """A transcription ready to run: its audio decoded and options checked (every refusal is
    raised before this exists). :meth:`run` decodes it; :meth:`cancel` stops it at the next
    window (from any thread)."""

    transcriber: Transcriber
    samples: np.ndarray  # (n,) float32 at 16 kHz
    options: TranscribeOptions
    windows: EngineWindows

    @property
    def duration(self) -> float:
        """The audio's length in seconds."""
        return len(self.samples) / SAMPLING_RATE

    def run(self, on_segments: Callable[[list[Segment]], None] | None = None) -> Transcription:
        """Decode every window, each in the engine's batch (``on_segments``: each window's
        segments once final). Raises :class:`TranscriptionFailed` past the time bound or once
        cancelled, :class:`~transformer_kit.runtime.engine.QueueFull` when the engine's queue
        is full."""
        return self.transcriber.transcribe(self.samples, self.options, on_segments=on_segments)

    def cancel(self) -> None:
        """Stop decoding: the current window ends at the engine's next step, no other starts."""
        self.windows.cancel()


def prepare(engine: Engine, audio: Any, *, max_seconds: float, name: str | None = None,
            timeout: float | None = None, **options: Any) -> Transcribing:
    """A transcription of ``audio`` (a file's bytes or path: any format FFmpeg reads; at most
    ``max_seconds`` long, ``name`` naming it in refusals) by ``engine``'s speech model, each
    window decoded in the engine's batch, within ``timeout`` seconds from now in all (None: no
    bound); ``options``: the :class:`~transformer_kit.core.speech.TranscribeOptions`
    (num_beams 1). Raises InputError (an AudioError for the audio) for what cannot run."""
    model = engine.model
    settings = model.manifest.config.get("speech")
    if settings is None or model.tokenizer is None:
        raise InputError("This engine's model is not a speech model with a tokenizer; serve a "
                         "Whisper export to transcribe.")
    chosen = transcribe_options(**options)
    if chosen.num_beams > 1:
        raise InputError("A server decodes each window by greedy search or sampling; leave "
                         "num_beams at 1.")
    deadline = None if timeout is None else time.perf_counter() + timeout
    windows = EngineWindows(engine, deadline)
    transcriber = Transcriber(SpeechConfig.model_validate(settings), model.audio_features,
                              windows, model.tokenizer, model.manifest.tgt_vocab,
                              model.context_length, model.aligner)
    transcriber.check(chosen)
    samples = load_audio(audio, max_seconds=max_seconds, name=name)
    return Transcribing(transcriber, samples, chosen, windows)
