"""What the OpenAI-style endpoints share: JSON errors (and the handlers for what FastAPI refuses
itself), the answer to a request that failed, a reply's ``usage`` and the server's Prometheus
metrics."""

from __future__ import annotations

import json
from collections.abc import Mapping

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException

from transformer_kit.core.errors import ContextLengthError
from transformer_kit.runtime import Engine, QueueFull
from transformer_kit.runtime.requests import Failure
from transformer_kit.runtime.text_stream import TextStream, Usage


class ErrorDetail(BaseModel):
    """What went wrong, in OpenAI's shape: a sentence, the kind of error, the field it is about
    and a code for programs."""

    message: str = Field(min_length=1)
    type: str
    param: str | None = None
    code: str | None = None


class ErrorBody(BaseModel):
    """The body of every error answer (:func:`error_response`)."""

    error: ErrorDetail


#: The error answers every endpoint declares in the OpenAPI schema (``/openapi.json``).
ERROR_RESPONSES: dict[int | str, dict] = {
    "4XX": {"model": ErrorBody, "description": "A request the server refuses: the message says why "
            "and what to send instead (400 bad request, 401 key, 404 model, 408/413 body)"},
    "5XX": {"model": ErrorBody, "description": "The server could not answer: 503 busy, 504 past "
            "the request's time bound"}}


def error_response(status: int, message: str, kind: str = "invalid_request_error",
                   param: str | None = None, code: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    """An OpenAI-style error: ``{"error": {"message", "type", "param", "code"}}`` with ``status``."""
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code}},
                        status_code=status, headers=headers)


def unknown_model(given: str, served: str) -> JSONResponse:
    """404 for a request naming a model this server does not serve."""
    return error_response(404, f"The model {given!r} does not exist here; this server serves "
                          f"{served!r} (GET /v1/models).", param="model")


def error_event(message: str, kind: str = "server_error", code: str | None = None) -> str:
    """A server-sent event carrying an OpenAI-style error, the shape of :func:`error_response`'s
    body (the openai client raises ``APIError`` on it); a stream that fails ends with it, then
    ``[DONE]``."""
    error = {"message": message, "type": kind, "param": None, "code": code}
    return f"data: {json.dumps({'error': error})}\n\n"


#: Each failure's status and OpenAI error type: past its time, failed, or (a pooling request)
#: stopped with the server before it ran.
_STATUS = {"timeout": (504, "timeout_error", "request_timeout"), "error": (500, "server_error", None),
           "cancelled": (503, "server_busy", None)}


def failure_response(failure: Failure | None) -> JSONResponse | None:
    """The error answer to a request that failed (504: past its time; 500: its step failed;
    503: the server stopped first), else None."""
    if failure is None:
        return None
    status, kind, code = _STATUS[failure.reason]
    return error_response(status, failure.message, kind=kind, code=code)


def failure_event(failure: Failure | None) -> str | None:
    """The error event that ends the stream of a request that failed, else None."""
    if failure is None:
        return None
    _, kind, code = _STATUS[failure.reason]
    return error_event(failure.message, kind, code)


class ServerMetrics:
    """Prometheus metrics of one server (a registry of its own, so several apps can live in one
    process)."""

    def __init__(self, engine: Engine) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("transformer_kit_requests", "Requests (completions, chat) by outcome",
                                ["outcome"], registry=self.registry)
        self.encoded = Counter("transformer_kit_encoder_requests", "Embeddings and rerank requests "
                               "served", ["endpoint"], registry=self.registry)
        self.input_tokens = Counter("transformer_kit_input_tokens", "Tokens embedded or scored",
                                    registry=self.registry)
        self.tokens = Counter("transformer_kit_generated_tokens", "Tokens generated",
                              registry=self.registry)
        self.audio = Counter("transformer_kit_audio_seconds", "Seconds of audio transcribed or "
                             "translated", ["endpoint"], registry=self.registry)
        self.ttft = Histogram("transformer_kit_time_to_first_token_seconds",
                              "From submit to the first token", registry=self.registry,
                              buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
        queue = Gauge("transformer_kit_queue_length", "Requests waiting", registry=self.registry)
        queue.set_function(lambda: engine.queue_length)
        batch = Gauge("transformer_kit_batch_size", "Rows in the running batch (embeddings, rerank: "
                      "requests in the last call)", registry=self.registry)
        batch.set_function(lambda: engine.stats.batch_size)
        largest = Gauge("transformer_kit_max_batch_size", "Most rows decoded together so far "
                        "(embeddings, rerank: most requests run in one call)", registry=self.registry)
        largest.set_function(lambda: engine.stats.max_batch_size)
        if engine.kind == "generate":
            self.registry.register(_PrefixCacheMetrics(engine))

    def finished(self, stream: TextStream) -> None:
        """Count a request that ended, or that its client left (then: "cancelled")."""
        request = stream.request
        self.requests.labels(request.finish_reason or "cancelled").inc()
        self.tokens.inc(len(request.tokens))
        if request.first_token_s is not None:
            self.ttft.observe(request.first_token_s)

    def served(self, endpoint: str, tokens: int) -> None:
        """Count an embeddings or rerank request that was answered, and its input tokens."""
        self.encoded.labels(endpoint).inc()
        self.input_tokens.inc(tokens)

    def transcribed(self, endpoint: str, seconds: float) -> None:
        """Count the audio of a transcription or translation that was answered."""
        self.audio.labels(endpoint).inc(seconds)

    def refused(self, exc: Exception) -> JSONResponse:
        """The answer to a request the engine would not take, counted: 503 when its queue is
        full (``QueueFull``), else 400 with the sentence (an ``InputError``; with the code
        ``context_length_exceeded``, as OpenAI's, for a ``ContextLengthError``)."""
        if isinstance(exc, QueueFull):
            self.requests.labels("queue_full").inc()
            return error_response(503, str(exc), kind="server_busy")
        self.requests.labels("refused").inc()
        code = "context_length_exceeded" if isinstance(exc, ContextLengthError) else None
        return error_response(400, str(exc), code=code)


class _PrefixCacheMetrics:
    """The engine's caches, read when /metrics is: of the prefix cache, requests with and without
    a cached prefix, prompt tokens reused, entries evicted (counters), bytes held and the bound
    (gauges), all 0 when the engine keeps none; the running batch's cache bytes and its bound.
    And prompt lookup's drafted and accepted tokens."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def collect(self):
        cache, name = self.engine.prefix_cache, "transformer_kit_prefix_cache"

        def read(attribute: str) -> int:
            return 0 if cache is None else getattr(cache, attribute)

        yield CounterMetricFamily(f"{name}_hits", "Requests whose prompt continued a cached prefix",
                                  value=read("hits"))
        yield CounterMetricFamily(f"{name}_misses", "Requests prefilled from their first token with "
                                  "the prefix cache on", value=read("misses"))
        yield CounterMetricFamily(f"{name}_tokens", "Prompt tokens taken from the prefix cache "
                                  "instead of prefilled", value=read("reused_tokens"))
        yield CounterMetricFamily(f"{name}_evictions", "Cached prompts dropped, least recently "
                                  "used first, to stay within the bound", value=read("evictions"))
        yield GaugeMetricFamily(f"{name}_bytes", "Bytes of prompts' caches held",
                                value=read("nbytes"))
        yield GaugeMetricFamily(f"{name}_max_bytes", "The prefix cache's bound in bytes (0: off)",
                                value=read("max_bytes"))
        held, bound = self.engine.cache_bytes
        yield GaugeMetricFamily("transformer_kit_cache_bytes", "Bytes the running batch's key/value "
                                "cache holds", value=held)
        yield GaugeMetricFamily("transformer_kit_cache_max_bytes", "The running batch's cache bound in "
                                "bytes (requests wait for room)", value=bound)
        stats = self.engine.stats
        yield CounterMetricFamily("transformer_kit_drafted_tokens", "Tokens prompt lookup drafted "
                                  "(requests with prompt_lookup_num_tokens, decoding alone)",
                                  value=stats.drafted_tokens)
        yield CounterMetricFamily("transformer_kit_accepted_tokens", "Drafted tokens that were the "
                                  "model's own choice: each saved a step", value=stats.accepted_tokens)


class PromptTokensDetails(BaseModel):
    """Of the prompt's tokens, those whose cache came from the server's prefix cache."""

    cached_tokens: int = Field(ge=0)


class UsageBody(BaseModel):
    """A reply's ``usage`` (:func:`usage`)."""

    prompt_tokens: int = Field(ge=0)
    completion_tokens: int = Field(ge=0)
    total_tokens: int = Field(ge=0)
    prompt_tokens_details: PromptTokensDetails


def usage(counts: Usage) -> dict:
    """A reply's ``usage`` in OpenAI's shape: token counts, and of the prompt's tokens those whose
    cache came from the server's prefix cache (``prompt_tokens_details.cached_tokens``)."""
    return {"prompt_tokens": counts.prompt_tokens, "completion_tokens": counts.completion_tokens,
            "total_tokens": counts.prompt_tokens + counts.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": counts.cached_tokens}}


def install_error_handlers(app: FastAPI, bodies: Mapping[str, type[BaseModel]] | None = None) -> None:
    """OpenAI-style JSON errors for what FastAPI refuses itself (bad JSON, fields, values) and
    for anything unexpected (500 with a sentence, never a traceback). ``bodies``: each endpoint's
    path -> its request model, so an unknown field's message lists the fields that endpoint takes
    (or, for a field in the model's ``refused_fields``, the reason it is not served)."""

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        if first.get("type") == "json_invalid":
            return error_response(400, "The request body is not valid JSON; send a JSON object.")
        if first.get("type") == "extra_forbidden":
            body = next((m for path, m in (bodies or {}).items() if request.url.path.endswith(path)), None)
            # a field the endpoint's convention defines but this server does not serve: its reason
            if (reason := getattr(body, "refused_fields", {}).get(where)) is not None:
                return error_response(400, f"{where!r} is not served: {reason}.", param=where)
            takes = (f"{request.url.path} takes {', '.join(body.model_fields)}" if body and "." not in where
                     else "this server does not take it")
            return error_response(400, f"Unknown field {where!r}; {takes}. Leave it out.", param=where)
        return error_response(400, f"Field {where or 'body'!r}: {first.get('msg')} (got "
                              f"{first.get('input')!r}).", param=where or None)

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, exc: HTTPException) -> JSONResponse:
        return error_response(exc.status_code, str(exc.detail))

    @app.exception_handler(Exception)
    async def unexpected(_: Request, exc: Exception) -> JSONResponse:
        return error_response(500, f"The server failed on this request ({type(exc).__name__}: {exc}); "
                              "it keeps serving others.", kind="server_error")
