"""``POST /v1/audio/transcriptions`` and ``POST /v1/audio/translations`` in OpenAI's convention
over the runtime's :meth:`~transformer_kit.runtime.Service.transcribe`: an audio file in
(multipart), its text out, each window of every file decoded in the engine's batch.

The form's fields, as OpenAI's: ``file`` (any format FFmpeg reads: flac, mp3, mp4, m4a, ogg,
wav, webm, ...), ``model``, ``language`` (transcriptions: the spoken language's code; none:
detected), ``prompt`` (text that came before: names, spellings), ``response_format`` (json,
text, srt, verbose_json, vtt), ``temperature`` (0: greedy, and the higher temperatures
openai-whisper falls back through where a window's text repeats itself or is unlikely; more:
sampling at that temperature alone, seeded), ``timestamp_granularities[]`` (``segment``,
``word`` or both: what verbose_json carries; words are timed by the model's alignment heads,
at the cost of one more encoder and decoder pass per window) and ``stream`` (server-sent
``transcript.text.delta`` events, a window's text each once it is final, then
``transcript.text.done`` with the whole text). A translation
is a transcription into English (``language`` is not a field of it).

Refusals are 400 with a sentence (a file that is not audio, holds no sound or runs past the
server's ``--max-audio-seconds``; an English-only model asked to translate); the body bound
(``--max-body-mb``) is the guard's 413.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections.abc import AsyncIterator
from typing import Any, Literal

from fastapi import Request, Response, UploadFile
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from transformer_kit.apps.serving.lifecycle import CLIENT_LEFT, unless_client_leaves
from transformer_kit.apps.serving.openai_api import error_event, failure_event, failure_response
from transformer_kit.apps.serving.routes import Family, Served, Unanswered, endpoint
from transformer_kit.core.errors import InputError
from transformer_kit.core.speech.formats import render, verbose
from transformer_kit.core.speech.transcriber import FALLBACK_TEMPERATURES
from transformer_kit.runtime import QueueFull
from transformer_kit.runtime.transcription import Transcribing, TranscriptionFailed

#: The formats a stream's events may carry: text alone (subtitles and segments need the whole).
STREAMED_FORMATS = ("json", "text")


class TranslationRequest(BaseModel):
    """The form of ``POST /v1/audio/translations``: OpenAI's fields; any other is refused (400)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    file: UploadFile
    model: str
    prompt: str | None = None
    response_format: Literal["json", "text", "srt", "verbose_json", "vtt"] = "json"
    temperature: float = Field(0.0, ge=0, le=1)
    timestamp_granularities: list[Literal["segment", "word"]] = Field(
        default_factory=lambda: ["segment"], alias="timestamp_granularities[]")
    stream: bool = False


class TranscriptionRequest(TranslationRequest):
    """The form of ``POST /v1/audio/transcriptions``: a translation's fields and ``language``."""

    language: str | None = None


class TranscriptionUsage(BaseModel):
    type: Literal["duration"]
    seconds: int = Field(ge=0)


class TranscriptionSegment(BaseModel):
    id: int = Field(ge=0)
    seek: int = Field(ge=0)
    start: float = Field(ge=0)
    end: float = Field(ge=0)
    text: str
    tokens: list[int]
    temperature: float
    avg_logprob: float | None
    compression_ratio: float


class TranscriptionWord(BaseModel):
    word: str
    start: float = Field(ge=0)
    end: float = Field(ge=0)


class TranscriptionAnswer(BaseModel):
    """The JSON answers: ``json``'s text (and usage), ``verbose_json``'s task, language,
    duration, and the segments or words (or both) its granularities ask for; text, srt and vtt
    answer ``text/plain``."""

    text: str
    usage: TranscriptionUsage
    task: str | None = None
    language: str | None = None
    duration: float | None = Field(None, ge=0)
    segments: list[TranscriptionSegment] | None = None
    words: list[TranscriptionWord] | None = None


def _usage(duration: float) -> dict[str, Any]:
    """OpenAI's usage of an audio request: its duration in whole seconds."""
    return {"type": "duration", "seconds": math.ceil(duration)}


def _event(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


class TranscriptionServer:
    """Both endpoints over ``service`` (a speech model's), serving ``model_name``."""

    def __init__(self, served: Served) -> None:
        self.service, self.model_name, self.metrics = served.service, served.name, served.metrics

    @endpoint
    async def transcriptions(self, body: TranslationRequest, request: Request) -> Any:
        task = "translate" if request.url.path.endswith("/translations") else "transcribe"
        if body.stream and body.response_format not in STREAMED_FORMATS:
            raise InputError(f"stream gives the text as events, so response_format must be "
                             f"{' or '.join(STREAMED_FORMATS)} with it (given "
                             f"{body.response_format!r}); ask for {body.response_format} without "
                             "stream.")
        granularities = set(body.timestamp_granularities)
        if "word" in granularities and body.response_format != "verbose_json":
            raise InputError(f"Word timestamps come in verbose_json only (response_format given: "
                             f"{body.response_format!r}); ask for response_format verbose_json "
                             "with timestamp_granularities[] word.")
        audio = await body.file.read()
        options: dict[str, Any] = {
            "task": task, "prompt": body.prompt, "language": getattr(body, "language", None) or None,
            "temperature": FALLBACK_TEMPERATURES if body.temperature == 0 else body.temperature,
            "word_timestamps": "word" in granularities}
        # decoding the audio (FFmpeg) off the loop; refusals raise here, before any answer
        job = await asyncio.to_thread(self.service.transcribe, audio, name=body.file.filename or "file",
                                      **options)
        if body.stream:
            return StreamingResponse(self._events(job, request.url.path), media_type="text/event-stream")
        answered, result = await unless_client_leaves(request.receive, asyncio.to_thread(self._run, job))
        if not answered:
            job.cancel()
            raise Unanswered(Response(status_code=CLIENT_LEFT))
        self.metrics.transcribed(request.url.path, result.duration)
        if body.response_format in ("json", "verbose_json"):
            answer = ({"text": result.text.strip()} if body.response_format == "json"
                      else verbose(result, segments="segment" in granularities,
                                   words="word" in granularities))
            return JSONResponse({**answer, "usage": _usage(result.duration)})
        return PlainTextResponse(render(result, body.response_format))

    @staticmethod
    def _run(job: Transcribing) -> Any:
        """The transcription's result, or :class:`Unanswered` with its failure's answer."""
        try:
            return job.run()
        except TranscriptionFailed as failed:
            raise Unanswered(failure_response(failed.failure)) from None

    async def _events(self, job: Transcribing, path: str) -> AsyncIterator[str]:
        """The stream: a ``transcript.text.delta`` per window with text, then
        ``transcript.text.done`` (or an error event); the transcription is cancelled when the
        client leaves."""
        loop = asyncio.get_running_loop()
        pieces: asyncio.Queue[str] = asyncio.Queue()

        def window(segments: list[Any]) -> None:
            text = "".join(segment.text for segment in segments)
            if text:
                loop.call_soon_threadsafe(pieces.put_nowait, text)

        running = asyncio.ensure_future(asyncio.to_thread(job.run, window))
        try:
            while True:
                getting = asyncio.ensure_future(pieces.get())
                await asyncio.wait({getting, running}, return_when=asyncio.FIRST_COMPLETED)
                if not getting.done():
                    getting.cancel()
                    break
                yield _event({"type": "transcript.text.delta", "delta": getting.result()})
            while not pieces.empty():  # the last windows' text, put before the run ended
                yield _event({"type": "transcript.text.delta", "delta": pieces.get_nowait()})
            try:
                result = running.result()
            except TranscriptionFailed as failed:
                yield failure_event(failed.failure) or ""
                return
            except QueueFull as exc:  # a window found the engine's queue full
                yield error_event(str(exc), "server_busy")
                return
            except InputError as exc:  # the engine refused a window (a bound)
                yield error_event(str(exc), "invalid_request_error")
                return
            self.metrics.transcribed(path, job.duration)
            yield _event({"type": "transcript.text.done", "text": result.text.strip(),
                          "usage": _usage(job.duration)})
            yield "data: [DONE]\n\n"
        finally:
            job.cancel()
            with contextlib.suppress(BaseException):
                await running


ROUTES = Family(TranscriptionServer, TranscriptionServer.transcriptions, ("/v1/audio/transcriptions",),
                TranscriptionRequest, TranscriptionAnswer, streams=True, form=True)
TRANSLATIONS = Family(TranscriptionServer, TranscriptionServer.transcriptions,
                      ("/v1/audio/translations",), TranslationRequest, TranscriptionAnswer,
                      streams=True, form=True)
