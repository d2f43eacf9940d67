"""Speech: audio in (PyAV), Whisper's decoding rules and long-form pipeline, the same for every
runtime."""

from transformer_kit.core.speech.audio import AudioError, as_samples, load_audio
from transformer_kit.core.speech.segments import Segment
from transformer_kit.core.speech.transcriber import (
    TranscribeOptions,
    Transcriber,
    Transcription,
    model_generate,
    transcribe_options,
)

__all__ = ["AudioError", "Segment", "TranscribeOptions", "Transcriber", "Transcription",
           "as_samples", "load_audio", "model_generate",
           "transcribe_options"]
