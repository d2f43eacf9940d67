"""A transcription written out in OpenAI's response formats: ``text``, ``json``,
``verbose_json`` (segments and words with their times), ``srt`` and ``vtt`` (subtitles)."""

from __future__ import annotations

import json
import math
from typing import Any

from transformer_kit.core.errors import InputError
from transformer_kit.core.speech.transcriber import Transcription

#: OpenAI's transcription response formats.
FORMATS = ("json", "text", "srt", "verbose_json", "vtt")


def _clock(seconds: float, separator: str) -> str:
    """hh:mm:ss,mmm (srt) or hh:mm:ss.mmm (vtt)."""
    millis = max(0, round(seconds * 1000))
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{separator}{millis:03d}"


def _cues(result: Transcription) -> list[tuple[float, float, str]]:
    return [(s.start, s.end, s.text.strip()) for s in result.segments if s.text.strip()]


def srt(result: Transcription) -> str:
    """SubRip subtitles: a numbered cue per segment."""
    return "".join(f"{i}\n{_clock(start, ',')} --> {_clock(end, ',')}\n{text}\n\n"
                   for i, (start, end, text) in enumerate(_cues(result), 1))


def vtt(result: Transcription) -> str:
    """WebVTT subtitles: the header, then a cue per segment."""
    return "WEBVTT\n\n" + "".join(f"{_clock(start, '.')} --> {_clock(end, '.')}\n{text}\n\n"
                                  for start, end, text in _cues(result))


def verbose(result: Transcription, words: bool = False, segments: bool = True) -> dict[str, Any]:
    """OpenAI's ``verbose_json``: task, language, duration, text, the ``segments`` (id, seek,
    start, end, text, tokens, temperature, avg_logprob, compression_ratio) and, with ``words``,
    the words (word without its leading space, start, end)."""
    out: dict[str, Any] = {
        "task": result.task, "language": result.language, "duration": round(result.duration, 3),
        "text": result.text.strip(),
    }
    if segments:
        out["segments"] = [{"id": i, "seek": s.seek, "start": round(s.start, 3),
                            "end": round(s.end, 3), "text": s.text, "tokens": s.tokens,
                            "temperature": s.temperature,
                            "avg_logprob": None if math.isnan(s.avg_logprob) else s.avg_logprob,
                            "compression_ratio": s.compression_ratio}
                           for i, s in enumerate(result.segments)]
    if words:
        out["words"] = [{"word": w["word"].strip(), "start": w["start"], "end": w["end"]}
                        for w in result.words]
    return out


def render(result: Transcription, response_format: str = "json", words: bool = False) -> str:
    """The transcription in ``response_format`` (one of :data:`FORMATS`) as text."""
    if response_format == "text":
        return result.text.strip() + "\n"
    if response_format == "json":
        return json.dumps({"text": result.text.strip()}, ensure_ascii=False)
    if response_format == "verbose_json":
        return json.dumps(verbose(result, words), ensure_ascii=False)
    if response_format == "srt":
        return srt(result)
    if response_format == "vtt":
        return vtt(result)
    raise InputError(f"response_format {response_format!r} is not one of {', '.join(FORMATS)}.")
