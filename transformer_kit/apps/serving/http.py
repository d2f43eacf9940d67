"""An HTTP server in the OpenAI convention over the continuous-batching engine, so existing
clients (the ``openai`` package, curl) work unchanged.

``POST /v1/completions`` (prompt as text or token ids, ``max_tokens``, ``temperature`` (0 =
greedy), ``top_p``, ``seed``, ``stop``, ``stream`` as server-sent events),
``POST /v1/chat/completions`` (messages rendered by the export's chat template, tools,
``response_format``; in :mod:`.chat`), ``GET /v1/models``, ``GET /health`` and ``GET /metrics``
(Prometheus text). An embedding model's export is served on ``POST /v1/embeddings``
(:mod:`.embeddings`), a cross-encoder's on ``POST /v1/rerank`` (:mod:`.rerank`), both over an
:class:`.EmbeddingEngine` that batches across clients; the other kind's endpoints answer 400
with a sentence naming the one this model serves. Each completions choice also carries
``token_ids``, the ids behind its text (a streamed chunk: the ids of that chunk). Errors are
OpenAI-style JSON (``{"error": {"message", "type", "param", "code"}}``, :mod:`.openai_api`) with
the status that fits: 400 for a bad request (``context_length_exceeded`` for a prompt over the
server's bound or one that leaves no room for ``max_tokens``), 404 for an unknown model, 503 when
the queue is full, 504 for a request that ran past the server's time bound (a stream ends with
an error event instead); never a traceback. In front of all of it, :class:`.Guard` checks the
API key and bounds the request body (401, 413, 408).
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, StreamingResponse
from prometheus_client import generate_latest
from pydantic import BaseModel, ConfigDict, Field

from transformer_kit.apps.serving.chat import ChatCompletionRequest, ChatServer
from transformer_kit.apps.serving.embedding_engine import EmbeddingEngine
from transformer_kit.apps.serving.embeddings import EmbeddingRequest, EmbeddingServer
from transformer_kit.apps.serving.engine import Engine, QueueFull
from transformer_kit.apps.serving.guard import DEFAULT_BODY_SECONDS, DEFAULT_MAX_BODY_BYTES, Guard
from transformer_kit.apps.serving.openai_api import (
    Limits,
    ServerMetrics,
    error_response,
    failure_event,
    failure_response,
    finish_reason,
    install_error_handlers,
    usage,
)
from transformer_kit.apps.serving.requests import Request as EngineRequest
from transformer_kit.apps.serving.rerank import RerankRequest, RerankServer
from transformer_kit.decoding.text import TextPieces
from transformer_kit.errors import InputError


class CompletionRequest(BaseModel):
    """The body of ``POST /v1/completions``: OpenAI's fields this server honours; any other
    field is refused (400), so a client never believes an option took effect when it did not."""

    model_config = ConfigDict(extra="forbid")

    model: str
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int = Field(16, ge=0)
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    n: Literal[1] = 1
    user: str | None = None
    #: An extension (as vLLM's extra parameters; the openai client sends it in ``extra_body``):
    #: speculative decoding with prompt lookup while the request decodes alone.
    prompt_lookup_num_tokens: int | None = Field(None, ge=1, le=64)


class CompletionServer:
    """The endpoints' work over one engine, routed by ``create_app`` (which each replica of the
    Ray Serve deployment in :mod:`.ray_serve` serves too), within ``limits`` (None: a prompt of
    at most the model's context length, no time bound)."""

    def __init__(self, engine: Engine | EmbeddingEngine, model_name: str,
                 limits: Limits | None = None) -> None:
        self.engine, self.model_name = engine, model_name
        self.limits = limits or Limits.of(engine.model.context_length)
        self.metrics = ServerMetrics(engine)
        self.created = int(time.time())

    async def health(self) -> dict:
        return {"status": "ok"}

    async def models(self) -> dict:
        return {"object": "list", "data": [{"id": self.model_name, "object": "model",
                                            "created": self.created, "owned_by": "transformer-kit"}]}

    async def prometheus(self) -> PlainTextResponse:
        return PlainTextResponse(generate_latest(self.metrics.registry).decode(),
                                 media_type="text/plain; version=0.0.4")

    async def completions(self, body: CompletionRequest) -> Any:
        model, metrics = self.engine.model, self.metrics
        if body.model != self.model_name:
            return error_response(404, f"The model {body.model!r} does not exist here; this server "
                                  f"serves {self.model_name!r} (GET /v1/models).", param="model")
        stops = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
        try:
            ids = _prompt_ids(body.prompt, model)
            self.limits.check_prompt(len(ids))
            options = {"max_new_tokens": body.max_tokens, "seed": body.seed}
            if body.prompt_lookup_num_tokens is not None:
                options["prompt_lookup_num_tokens"] = body.prompt_lookup_num_tokens
            if body.temperature > 0:
                options.update(do_sample=True, temperature=body.temperature, top_p=body.top_p)
            matcher = model.tokenizer.stop_matcher(stops) if stops and model.tokenizer else None
            if stops and matcher is None:
                raise InputError("stop strings need the model's tokenizer, and this export has none; "
                                 "leave stop out.")
            request = self.engine.submit(ids, stop_matcher=matcher,
                                         timeout=self.limits.max_request_seconds, **options)
        except (QueueFull, InputError) as exc:
            return metrics.refused(exc)
        ident, eos = f"cmpl-{uuid.uuid4().hex}", request.options.eos_ids(model.manifest.eos_id)
        pieces = TextPieces(model.tokenizer, eos, stops) if model.tokenizer else None
        if body.stream:
            return StreamingResponse(_events(request, pieces, ident, self.model_name, metrics),
                                     media_type="text/event-stream")
        tokens = [t async for arrived in request.arrivals() for t in arrived]
        text = "" if pieces is None else "".join(pieces.add(t) for t in tokens) + pieces.finish()
        metrics.finished(request)
        if (failed := failure_response(request)) is not None:
            return failed
        return {"id": ident, "object": "text_completion", "created": int(time.time()),
                "model": self.model_name,
                "choices": [{"index": 0, "text": text, "token_ids": tokens, "logprobs": None,
                             "finish_reason": finish_reason(request)}],
                "usage": usage(len(ids), len(tokens), request.cached_tokens)}


#: What each kind of model is, as the wrong endpoint's answer names it, and the paths it serves.
_KINDS = {"generator": ("a text generator", ("/v1/completions", "/v1/chat/completions")),
          "embeddings": ("a sentence-embedding model", ("/v1/embeddings",)),
          "rerank": ("a cross-encoder", ("/v1/rerank", "/rerank"))}


def create_app(engine: Engine | EmbeddingEngine, model_name: str, *, api_key: str | None = None,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
               body_seconds: float = DEFAULT_BODY_SECONDS, max_prompt_tokens: int | None = None,
               max_request_seconds: float | None = None) -> FastAPI:
    """The FastAPI application serving ``engine`` under the model name ``model_name``: a
    decoder's :class:`Engine` on the completions endpoints, an :class:`EmbeddingEngine` on
    /v1/embeddings or /v1/rerank (its ``kind``). Behind a :class:`.Guard`: ``api_key`` (None:
    none) needed on every endpoint but /health, request bodies of at most ``max_body_bytes``
    arriving within ``body_seconds``. A completion's or chat's prompt may hold at most
    ``max_prompt_tokens`` tokens (None: the model's context length, else
    :data:`~.openai_api.DEFAULT_MAX_PROMPT_TOKENS`; more: 400), and it may take at most
    ``max_request_seconds`` from arrival to last token (None: no bound; past it the engine stops
    it and frees its row: 504, or an error event ending the stream). Embeddings and rerank keep
    their own bound on texts (the model's positions). Raises InputError for a bound that is not
    positive."""
    limits = Limits.of(engine.model.context_length, max_prompt_tokens, max_request_seconds)
    app = FastAPI(title="transformer-kit", docs_url=None, redoc_url=None)
    app.add_middleware(Guard, api_key=api_key, max_body_bytes=max_body_bytes,
                       body_seconds=body_seconds)
    install_error_handlers(app, {"/v1/completions": CompletionRequest,
                                 "/v1/chat/completions": ChatCompletionRequest,
                                 "/v1/embeddings": EmbeddingRequest, "/rerank": RerankRequest})
    server = CompletionServer(engine, model_name, limits)
    app.get("/health")(server.health)
    app.get("/v1/models")(server.models)
    app.get("/metrics")(server.prometheus)
    if isinstance(engine, EmbeddingEngine):
        kind = engine.kind
        if kind == "embeddings":
            app.post("/v1/embeddings", response_model=None)(
                EmbeddingServer(engine, model_name, server.metrics).embeddings)
        else:
            rerank = RerankServer(engine, model_name, server.metrics).rerank
            app.post("/v1/rerank", response_model=None)(rerank)
            app.post("/rerank", response_model=None)(rerank)
    else:
        kind = "generator"
        app.post("/v1/completions", response_model=None)(server.completions)
        chat = ChatServer(engine, model_name, server.metrics, limits)
        app.post("/v1/chat/completions", response_model=None)(chat.chat_completions)
    what, serves = _KINDS[kind]
    for other, (_, paths) in _KINDS.items():
        for path in paths if other != kind else ():
            app.post(path, response_model=None)(_wrong_endpoint(model_name, what, serves))
    app.state.server = server
    return app


def _wrong_endpoint(model_name: str, what: str, serves: tuple[str, ...]) -> Any:
    """A handler answering 400 on an endpoint this model cannot serve, naming the one it does."""

    async def wrong(request: Request) -> Any:
        return error_response(400, f"{model_name!r} is {what}, so this server answers POST "
                              f"{' and '.join(serves)}, not {request.url.path}; send the request "
                              "there, or serve a model of the kind this endpoint needs.")

    return wrong


def _prompt_ids(prompt: Any, model) -> list[int]:
    """One prompt's token ids from text (with the export's tokenizer) or ids."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        raise InputError(f"This server takes one prompt per request; got {len(prompt)}. Send one "
                         "request per prompt (they are batched together on the server).")
    if isinstance(prompt, str):
        if model.tokenizer is None:
            raise InputError("This export has no tokenizer, so the prompt must be token ids (a list "
                             "of integers), not text.")
        ids, _ = model.tokenizer.encode([prompt])
        return ids[0].tolist()
    return list(prompt)


async def _events(request: EngineRequest, pieces: TextPieces | None, ident: str, model_name: str,
                  metrics: ServerMetrics) -> AsyncIterator[str]:
    """Server-sent events: a chunk per token, the last with the finish reason, then [DONE]; a
    request that failed (its time ran out, decoding failed) ends with an error event instead of
    the last chunk. A client that goes away closes this generator: its request is cancelled,
    its row leaves."""
    head = json.dumps({"id": ident, "object": "text_completion", "created": int(time.time()),
                       "model": model_name})[:-1]

    def chunk(text: str, ids: list[int], reason: str | None) -> str:
        choice = json.dumps([{"index": 0, "text": text, "token_ids": ids, "logprobs": None,
                              "finish_reason": reason}])
        return f'data: {head}, "choices": {choice}}}\n\n'

    try:
        async for arrived in request.arrivals():  # the events of several tokens in one write
            yield "".join(chunk(pieces.add(t) if pieces else "", [t], None) for t in arrived)
        if (failed := failure_event(request)) is not None:
            yield failed
        else:
            yield chunk(pieces.finish() if pieces else "", [], finish_reason(request))
        yield "data: [DONE]\n\n"
    finally:
        request.cancel()  # no-op when it ended; frees the row when the client left mid-stream
        metrics.finished(request)  # still running: counted as cancelled, the engine ends it next


@contextlib.contextmanager
def serve_in_thread(app: FastAPI, host: str = "127.0.0.1", timeout: float = 30.0) -> Iterator[str]:
    """Run ``app`` with uvicorn in a thread of this process, on a free port of ``host``; yields
    its base URL and stops it on exit (tests and benchmarks; ``transformer-kit serve`` for use)."""
    import uvicorn

    sock = socket.socket()
    sock.bind((host, 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError(f"the server did not start on {host} within {timeout} s")
        time.sleep(0.02)
    try:
        yield f"http://{host}:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(15)
        sock.close()
