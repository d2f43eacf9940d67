"""What the OpenAI-style endpoints share: JSON errors (and the handlers for what FastAPI refuses
itself), the finish reason of an engine request, and the server's Prometheus metrics."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from pydantic import BaseModel
from starlette.exceptions import HTTPException

from transformer_kit.apps.serving.engine import Engine, QueueFull
from transformer_kit.apps.serving.requests import Request as EngineRequest

if TYPE_CHECKING:
    from transformer_kit.apps.serving.embedding_engine import EmbeddingEngine


def error_response(status: int, message: str, kind: str = "invalid_request_error",
                   param: str | None = None, code: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    """An OpenAI-style error: ``{"error": {"message", "type", "param", "code"}}`` with ``status``."""
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code}},
                        status_code=status, headers=headers)


class ServerMetrics:
    """Prometheus metrics of one server (a registry of its own, so several apps can live in one
    process)."""

    def __init__(self, engine: Engine | EmbeddingEngine) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("transformer_kit_requests", "Requests (completions, chat) by outcome",
                                ["outcome"], registry=self.registry)
        self.encoded = Counter("transformer_kit_encoder_requests", "Embeddings and rerank requests "
                               "served", ["endpoint"], registry=self.registry)
        self.input_tokens = Counter("transformer_kit_input_tokens", "Tokens embedded or scored",
                                    registry=self.registry)
        self.tokens = Counter("transformer_kit_generated_tokens", "Tokens generated",
                              registry=self.registry)
        self.ttft = Histogram("transformer_kit_time_to_first_token_seconds",
                              "From submit to the first token", registry=self.registry,
                              buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
        queue = Gauge("transformer_kit_queue_length", "Requests waiting", registry=self.registry)
        queue.set_function(lambda: engine.queue_length)
        batch = Gauge("transformer_kit_batch_size", "Rows in the running batch (embeddings, rerank: "
                      "requests in the last call)", registry=self.registry)
        batch.set_function(lambda: engine.stats["batch_size"])
        largest = Gauge("transformer_kit_max_batch_size", "Most rows decoded together so far "
                        "(embeddings, rerank: most requests run in one call)", registry=self.registry)
        largest.set_function(lambda: engine.stats["max_batch_size"])

    def finished(self, request: EngineRequest) -> None:
        """Count a request that ended, or that its client left (then: "cancelled")."""
        self.requests.labels(request.finish_reason or "cancelled").inc()
        self.tokens.inc(len(request.tokens))
        if request.first_token_s is not None:
            self.ttft.observe(request.first_token_s)

    def served(self, endpoint: str, tokens: int) -> None:
        """Count an embeddings or rerank request that was answered, and its input tokens."""
        self.encoded.labels(endpoint).inc()
        self.input_tokens.inc(tokens)

    def refused(self, exc: Exception) -> JSONResponse:
        """The answer to a request the engine would not take, counted: 503 when its queue is
        full (``QueueFull``), else 400 with the sentence (an ``InputError``)."""
        if isinstance(exc, QueueFull):
            self.requests.labels("queue_full").inc()
            return error_response(503, str(exc), kind="server_busy")
        self.requests.labels("refused").inc()
        return error_response(400, str(exc))


def install_error_handlers(app: FastAPI, bodies: Mapping[str, type[BaseModel]] | None = None) -> None:
    """OpenAI-style JSON errors for what FastAPI refuses itself (bad JSON, fields, values) and
    for anything unexpected (500 with a sentence, never a traceback). ``bodies``: each endpoint's
    path -> its request model, so an unknown field's message lists the fields that endpoint takes."""

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        if first.get("type") == "json_invalid":
            return error_response(400, "The request body is not valid JSON; send a JSON object.")
        if first.get("type") == "extra_forbidden":
            body = next((m for path, m in (bodies or {}).items() if request.url.path.endswith(path)), None)
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


def finish_reason(request: EngineRequest) -> str:
    """OpenAI's finish reason of an ended engine request: "length" or "stop"."""
    return "length" if request.finish_reason == "length" else "stop"
