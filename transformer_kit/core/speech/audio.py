"""Audio in: a file (any format FFmpeg reads: flac, mp3, mp4, m4a, ogg, wav, webm, ...) or a
numpy array at any sample rate, as 16 kHz mono float32 samples.

PyAV decodes and resamples: it bundles FFmpeg's libraries in its wheels, so every container and
codec OpenAI's transcription endpoint accepts is read without a system FFmpeg, and its
resampler is FFmpeg's own (swresample), the one openai-whisper and faster-whisper use.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from transformer_kit.core.errors import InputError
from transformer_kit.core.speech_config import SAMPLING_RATE

#: What a file or array may hold at most by default: two hours.
MAX_SECONDS = 2 * 60 * 60


class AudioError(InputError):
    """Audio that cannot be used: not audio, empty, too long, or in no format FFmpeg reads."""


def _resampled(frames: Any, resampler: Any) -> list[np.ndarray]:
    return [f.to_ndarray().reshape(-1) for frame in frames for f in resampler.resample(frame)]


def load_audio(source: str | Path | bytes | BinaryIO, *, max_seconds: float = MAX_SECONDS,
               name: str | None = None) -> np.ndarray:
    """The audio of a file (a path, its bytes or an open binary file) as (n,) float32 samples
    at 16 kHz, mono (channels averaged by FFmpeg's resampler).

    Raises :class:`AudioError` with a sentence for a file that is not audio, holds no samples or
    is longer than ``max_seconds``. ``name`` names the file in those sentences."""
    import av  # imported when audio is read: the rest of the kit does not need FFmpeg

    shown = name or (str(source) if isinstance(source, (str, Path)) else "the file")
    if isinstance(source, (str, Path)) and not Path(source).is_file():
        raise AudioError(f"{shown}: no such file; give the path of an audio file.")
    if isinstance(source, bytes):
        source = io.BytesIO(source)
    limit = int(max_seconds * SAMPLING_RATE)
    too_long = AudioError(f"{shown} is longer than {max_seconds:g} s, the most this takes; cut it "
                          "into shorter files.")
    try:
        with av.open(source if not isinstance(source, Path) else str(source), mode="r") as container:
            chunks = _decoded(container, shown, limit, too_long)
    except AudioError:
        raise
    except (av.error.FFmpegError, ValueError, OSError, UnicodeDecodeError) as exc:
        raise AudioError(f"{shown} could not be read as audio ({type(exc).__name__}: {exc}); give "
                         "a file in a format FFmpeg reads, such as flac, mp3, mp4, m4a, ogg, wav "
                         "or webm.") from None
    samples = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
    if len(samples) == 0:
        raise AudioError(f"{shown} holds no audio samples; give a file with sound in it.")
    if len(samples) > limit:
        raise too_long
    return np.ascontiguousarray(samples, dtype=np.float32)


def _decoded(container: Any, shown: str, limit: int, too_long: AudioError) -> list[np.ndarray]:
    """The first audio stream's samples, 16 kHz mono, in pieces; ``too_long`` raised as soon as
    they pass ``limit`` (a long file is not decoded whole to be refused)."""
    import av

    if not container.streams.audio:
        raise AudioError(f"{shown} holds no audio stream (streams: "
                         f"{', '.join(s.type for s in container.streams) or 'none'}); give a file "
                         "with sound in it.")
    resampler = av.AudioResampler(format="flt", layout="mono", rate=SAMPLING_RATE)
    chunks, total = [], 0
    for packet in container.demux(audio=0):
        for piece in _resampled(packet.decode(), resampler):
            chunks.append(piece)
            total += len(piece)
        if total > limit:
            raise too_long
    return chunks + [f.to_ndarray().reshape(-1) for f in resampler.resample(None)]


def as_samples(audio: Any, sample_rate: int | None = None, *, max_seconds: float = MAX_SECONDS
               ) -> np.ndarray:
    """Audio given in Python as (n,) float32 samples at 16 kHz: a path or bytes of a file, or a
    numpy array (n,) mono or (n, channels) / (channels, n) with its ``sample_rate`` (resampled
    by FFmpeg's resampler when it is not 16 kHz; integer samples scaled to [-1, 1])."""
    if isinstance(audio, (str, Path, bytes)) or hasattr(audio, "read"):
        return load_audio(audio, max_seconds=max_seconds)
    if hasattr(audio, "detach") and hasattr(audio, "cpu"):  # a torch tensor, without importing torch
        audio = audio.detach().cpu().numpy()
    if not isinstance(audio, np.ndarray):
        raise AudioError(f"Audio must be a file path, a file's bytes or a numpy array of samples; "
                         f"got {type(audio).__name__}.")
    samples = _float_samples(audio)
    if samples.ndim == 2:  # channels on the shorter axis
        samples = samples.mean(axis=0 if samples.shape[0] < samples.shape[1] else 1)
    if samples.ndim != 1 or samples.size == 0:
        raise AudioError(f"Audio samples must be (n,) or (n, channels), n >= 1; got shape "
                         f"{tuple(audio.shape)}.")
    if not np.isfinite(samples).all():
        raise AudioError("Audio samples hold NaN or infinite values; give finite samples.")
    rate = SAMPLING_RATE if sample_rate is None else sample_rate
    if isinstance(rate, bool) or not isinstance(rate, (int, np.integer)) or rate <= 0:
        raise AudioError(f"sample_rate must be a positive integer (Hz), got {sample_rate!r}.")
    if len(samples) > max_seconds * rate:
        raise AudioError(f"The audio is longer than {max_seconds:g} s, the most this takes; cut it "
                         "into shorter pieces.")
    if rate != SAMPLING_RATE:
        samples = _resample(samples, int(rate))
    return np.ascontiguousarray(samples, dtype=np.float32)


def _float_samples(audio: np.ndarray) -> np.ndarray:
    if audio.dtype.kind == "f":
        return audio.astype(np.float32, copy=False)
    if audio.dtype.kind in "iu":  # PCM: full scale to [-1, 1]
        info = np.iinfo(audio.dtype)
        middle = (int(info.max) + int(info.min) + 1) / 2
        return ((audio.astype(np.float64) - middle) / (info.max - middle)).astype(np.float32)
    raise AudioError(f"Audio samples must be numbers, got dtype {audio.dtype}.")


def _resample(samples: np.ndarray, rate: int) -> np.ndarray:
    """(n,) float32 at ``rate`` -> at 16 kHz, by FFmpeg's resampler (as a file would be)."""
    import av

    frame = av.AudioFrame.from_ndarray(samples[None], format="flt", layout="mono")
    frame.sample_rate = rate
    resampler = av.AudioResampler(format="flt", layout="mono", rate=SAMPLING_RATE)
    pieces = [f.to_ndarray().reshape(-1) for f in resampler.resample(frame)]
    pieces += [f.to_ndarray().reshape(-1) for f in resampler.resample(None)]
    return np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
