"""An HTTP server in the OpenAI convention over the runtime's :class:`~transformer_kit.runtime.Service`,
so existing clients (the ``openai`` package, curl) work unchanged.

``POST /v1/completions`` (prompt as text or token ids, ``max_tokens``, ``temperature`` (0 =
greedy), ``top_p``, ``seed``, ``stop``, ``stream`` as server-sent events, and the sampling
fields it shares with chat, :mod:`.sampling_fields`: ``n`` choices, OpenAI's penalties and
``logit_bias``, vLLM's ``top_k``, ``min_p``, ``min_tokens``, ``ignore_eos``...),
``POST /v1/chat/completions`` (messages rendered by the export's chat template, tools,
``response_format``; in :mod:`.chat`), ``POST /v1/responses`` (OpenAI's Responses API over the
same path, with ``previous_response_id``; ``GET`` and ``DELETE /v1/responses/{id}`` read and
forget a stored one; in :mod:`.responses`), ``POST /tokenize`` and
``POST /detokenize`` (vLLM's, :mod:`.tokenization`), ``GET /v1/models``,
``GET /health`` and ``GET /metrics`` (Prometheus text). An embedding model's export is served
on ``POST /v1/embeddings`` (:mod:`.embeddings`), a cross-encoder's on ``POST /v1/rerank``
(:mod:`.rerank`), batched across clients by the same engine; the other kind's endpoints answer 400
with a sentence naming the one this model serves. Each completions choice also carries
``token_ids``, the ids behind its text (a streamed chunk: the ids of that chunk). Errors are
OpenAI-style JSON (``{"error": {"message", "type", "param", "code"}}``, :mod:`.openai_api`) with
the status that fits: 400 for a bad request (``context_length_exceeded`` for a prompt over the
server's bound or one that leaves no room for ``max_tokens``), 404 for an unknown model, 503 when
the queue is full, 504 for a request that ran past the server's time bound (a stream ends with
an error event instead); never a traceback. ``GET /openapi.json`` is the schema of what it
serves, each endpoint's error answers declared (``4XX``, ``5XX``: that JSON). In front of all of
it, :class:`.Guard` checks the API key and bounds the request body (401, 413, 408). A decoder's
server also serves a chat page at ``/`` (:mod:`.page`).
"""

from __future__ import annotations

import contextlib
import inspect
import json
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, Response, StreamingResponse
from prometheus_client import Gauge, generate_latest
from pydantic import ConfigDict, Field

from transformer_kit.apps.serving import choices, page
from transformer_kit.apps.serving.chat import ChatCompletionRequest, ChatServer
from transformer_kit.apps.serving.embeddings import EmbeddingRequest, EmbeddingServer
from transformer_kit.apps.serving.guard import DEFAULT_BODY_SECONDS, DEFAULT_MAX_BODY_BYTES, OPEN_PATHS, Guard
from transformer_kit.apps.serving.lifecycle import (
    CLIENT_LEFT,
    Admission,
    AdmissionGate,
    unless_client_leaves,
)
from transformer_kit.apps.serving.openai_api import (
    ERROR_RESPONSES,
    ServerMetrics,
    error_response,
    failure_event,
    failure_response,
    install_error_handlers,
    unknown_model,
    usage,
)
from transformer_kit.apps.serving.rerank import RerankRequest, RerankServer
from transformer_kit.apps.serving.response_store import DEFAULT_STORED_RESPONSES, ResponseStore
from transformer_kit.apps.serving.responses import ResponsesRequest, ResponsesServer, StoredResponses
from transformer_kit.apps.serving.sampling_fields import (
    SamplingFields,
    StreamOptions,
    request_options,
    stream_usage,
)
from transformer_kit.apps.serving.tokenization import (
    DetokenizeRequest,
    TokenizationServer,
    TokenizeRequest,
)
from transformer_kit.core.decoding.defaults import GENERATION_CONFIG_MODES
from transformer_kit.core.errors import InputError
from transformer_kit.runtime import Engine, Limits, QueueFull, Service
from transformer_kit.runtime.text_stream import TextStream, Usage

#: ``max_tokens`` of a completion that leaves it out (or sends null): OpenAI's 16.
COMPLETION_MAX_TOKENS = 16


class CompletionRequest(SamplingFields):
    """The body of ``POST /v1/completions``: OpenAI's fields this server honours and vLLM's
    sampling extras (:class:`.SamplingFields`); any other field is refused (400), so a client
    never believes an option took effect when it did not. Null is a field's default."""

    model_config = ConfigDict(extra="forbid")

    model: str
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(COMPLETION_MAX_TOKENS, ge=1)
    #: None: the checkpoint's default (its generation_config.json), else OpenAI's 1.
    temperature: float | None = Field(None, ge=0.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    #: An extension (as vLLM's extra parameters; the openai client sends it in ``extra_body``):
    #: speculative decoding with prompt lookup while the request decodes alone.
    prompt_lookup_num_tokens: int | None = Field(None, ge=1, le=64)


class CompletionServer:
    """The endpoints' work over one service, routed by ``create_app`` (which each replica of the
    Ray Serve deployment in :mod:`.ray_serve` serves too)."""

    def __init__(self, service: Service, model_name: str) -> None:
        self.service, self.model_name = service, model_name
        self.engine = service.engine
        self.metrics = ServerMetrics(service.engine)
        self.created = int(time.time())
        #: Every model name the app serves (the base's, then its adapters': ``create_app``).
        self.served = [model_name]

    async def health(self) -> dict:
        return {"status": "ok"}

    async def models(self) -> dict:
        """The served models; ``generation_defaults``: the checkpoint's sampling defaults that a
        request's missing fields take ({}: none, or ``--generation-config ignore``)."""
        defaults = self.service.generation_defaults
        return {"object": "list", "data": [{"id": name, "object": "model", "created": self.created,
                                            "owned_by": "transformer-kit",
                                            "generation_defaults": defaults} for name in self.served]}

    async def prometheus(self) -> PlainTextResponse:
        return PlainTextResponse(generate_latest(self.metrics.registry).decode(),
                                 media_type="text/plain; version=0.0.4")

    async def completions(self, body: CompletionRequest, request: Request) -> Any:
        metrics = self.metrics
        if body.model != self.model_name:
            return unknown_model(body.model, self.model_name)
        try:
            counts = stream_usage(body.stream_options, bool(body.stream))
            streams = self.service.complete_choices(
                _one_prompt(body.prompt), body.n or 1,
                max_tokens=COMPLETION_MAX_TOKENS if body.max_tokens is None else body.max_tokens,
                temperature=body.temperature, top_p=body.top_p, seed=body.seed, stop=body.stop,
                prompt_lookup_num_tokens=body.prompt_lookup_num_tokens, extra=request_options(body))
        except (QueueFull, InputError) as exc:
            return metrics.refused(exc)
        ident = f"cmpl-{uuid.uuid4().hex}"
        if body.stream:
            return StreamingResponse(_events(streams, ident, self.model_name, metrics, counts),
                                     media_type="text/event-stream")
        answered, texts = await unless_client_leaves(request.receive, choices.texts(streams))
        for stream in streams:
            stream.cancel()  # no-op when it ended; a client that left stops its decoding here
            metrics.finished(stream)
        if not answered:
            return Response(status_code=CLIENT_LEFT)
        if (failed := failure_response(choices.failure(streams))) is not None:
            return failed
        return {"id": ident, "object": "text_completion", "created": int(time.time()),
                "model": self.model_name,
                "choices": [{"index": i, "text": text, "token_ids": stream.token_ids, "logprobs": None,
                             "finish_reason": stream.finish_reason()}
                            for i, (stream, text) in enumerate(zip(streams, texts, strict=True))],
                "usage": usage(choices.total_usage(streams))}


#: What each kind of model is, as the wrong endpoint's answer names it, and the paths it serves.
_KINDS = {"generate": ("a text generator", ("/v1/completions", "/v1/chat/completions",
                                            "/v1/responses")),
          "embeddings": ("a sentence-embedding model", ("/v1/embeddings",)),
          "rerank": ("a cross-encoder", ("/v1/rerank", "/rerank"))}

#: A generating endpoint's answer in the OpenAPI schema: JSON, or server-sent events (``stream``).
_STREAMS: dict[int | str, dict] = {200: {"content": {"text/event-stream": {}}}}


def create_app(engine: Engine, model_name: str, *, api_key: str | None = None,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
               body_seconds: float = DEFAULT_BODY_SECONDS, max_prompt_tokens: int | None = None,
               max_request_seconds: float | None = None,
               stored_responses: int = DEFAULT_STORED_RESPONSES,
               adapters: dict[str, Engine] | None = None, generation_config: str = "auto") -> FastAPI:
    """The FastAPI application serving ``engine`` under the model name ``model_name``: a
    decoder's on the completions endpoints, an embedding model's on /v1/embeddings, a
    cross-encoder's on /v1/rerank (the engine's ``kind``). Behind a :class:`.Guard`: ``api_key``
    (None: none) needed on every endpoint but /health and a decoder's chat page (at /), request
    bodies of at most ``max_body_bytes`` arriving within ``body_seconds``. A prompt (a completion's, a chat's
    rendered conversation) may hold at most ``max_prompt_tokens`` tokens (None: the model's
    context length, else :data:`~transformer_kit.runtime.limits.DEFAULT_MAX_PROMPT_TOKENS`;
    more: 400), and any request may take at most ``max_request_seconds`` from arrival to its
    end (None: no bound; past it the engine stops it and frees its row: 504, or an error event
    ending the stream). Embeddings and rerank keep their own bound on texts (the model's
    positions). ``/v1/responses`` keeps the last ``stored_responses`` responses (0: none) for
    ``previous_response_id``, in memory (one store for the base and its adapters).
    ``generation_config``: "auto" (a request's missing sampling fields take the checkpoint's
    generation_config.json values, as vLLM's ``--generation-config auto``; listed in
    ``/v1/models``) or "ignore" (OpenAI's defaults). Raises InputError for a bound that is not
    positive or another ``generation_config``.

    ``adapters``: a decoder's engines per LoRA adapter (``Engine(model, adapter=name)``), each
    served as the model ``MODEL_NAME:NAME``: GET /v1/models lists them after the base, and a
    request's ``model`` picks the engine, whose rows are batched together."""
    limits = Limits.of(engine.model.context_length, max_prompt_tokens, max_request_seconds)
    if generation_config not in GENERATION_CONFIG_MODES:
        raise InputError(f"generation_config is {generation_config!r}; give one of "
                         f"{', '.join(GENERATION_CONFIG_MODES)}.")
    auto = generation_config == "auto"
    service = Service(engine, limits, generation_defaults=auto)
    served = {f"{model_name}:{name}": CompletionServer(Service(other, limits, generation_defaults=auto),
                                                       f"{model_name}:{name}")
              for name, other in (adapters or {}).items()}
    app = FastAPI(title="transformer-kit", docs_url=None, redoc_url=None, responses=ERROR_RESPONSES)
    app.add_middleware(Guard, api_key=api_key, max_body_bytes=max_body_bytes,
                       body_seconds=body_seconds, open_paths=OPEN_PATHS | page.PATHS)
    #: Requests in flight; ``transformer-kit serve`` closes it on SIGTERM (503 from then on).
    app.state.admission = Admission()
    app.add_middleware(AdmissionGate, admission=app.state.admission)  # outermost: counts all
    install_error_handlers(app, {"/v1/completions": CompletionRequest,
                                 "/v1/chat/completions": ChatCompletionRequest,
                                 "/v1/responses": ResponsesRequest,
                                 "/v1/embeddings": EmbeddingRequest, "/rerank": RerankRequest,
                                 "/tokenize": TokenizeRequest, "/detokenize": DetokenizeRequest})
    server = CompletionServer(service, model_name)
    Gauge("transformer_kit_http_requests_in_flight", "HTTP requests being answered (a stream "
          "until its last event)", registry=server.metrics.registry
          ).set_function(lambda: app.state.admission.in_flight)
    served = {model_name: server, **served}
    server.served = list(served)
    app.get("/health")(server.health)
    app.get("/v1/models")(server.models)
    app.get("/metrics", response_class=PlainTextResponse)(server.prometheus)
    tokenization = TokenizationServer(service, model_name, server.metrics)
    app.post("/tokenize", response_model=None)(tokenization.tokenize)
    app.post("/detokenize", response_model=None)(tokenization.detokenize)
    store = ResponseStore(stored_responses)
    handlers = {name: _endpoints(each, store) for name, each in served.items()}
    for path, handler in handlers[model_name].items():
        app.post(path, response_model=None, responses=_STREAMS if path in _KINDS["generate"][1] else None)(
            _by_model(handler, handlers, path) if adapters else handler)
    if service.kind == "generate":
        stored = StoredResponses(store, server.metrics)  # one store for the base and its adapters
        app.get("/v1/responses/{response_id}", response_model=None)(stored.retrieve)
        app.delete("/v1/responses/{response_id}", response_model=None)(stored.delete)
        page.add_page(app)  # the chat page at /, open without the key (it carries no secret)
    what, serves = _KINDS[service.kind]
    for other, (_, paths) in _KINDS.items():
        for path in paths if other != service.kind else ():
            app.post(path, response_model=None, include_in_schema=False)(
                _wrong_endpoint(model_name, what, serves))
    app.state.server, app.state.responses = server, store
    return app


def _by_model(base: Any, handlers: dict[str, dict[str, Any]], path: str) -> Any:
    """``base``'s endpoint at ``path`` handing each request to the handler of the model it names
    (the base's answers an unknown name with 404, naming every served model)."""

    async def routed(body: Any, request: Request) -> Any:
        chosen = handlers.get(body.model)
        if chosen is None:
            return unknown_model(body.model, ", ".join(handlers))
        handler = chosen[path]
        if "request" in inspect.signature(handler).parameters:  # it watches its client
            return await handler(body, request)
        return await handler(body)

    routed.__annotations__ = {**base.__annotations__, "request": Request}  # FastAPI reads the types
    return routed


def _endpoints(server: CompletionServer, store: ResponseStore) -> dict[str, Any]:
    """The handlers of the service's kind, by path (``store``: the Responses API's)."""
    service, name, metrics = server.service, server.model_name, server.metrics
    if service.kind == "generate":
        return {"/v1/completions": server.completions,
                "/v1/chat/completions": ChatServer(service, name, metrics).chat_completions,
                "/v1/responses": ResponsesServer(service, name, metrics, store).create}
    if service.kind == "embeddings":
        return {"/v1/embeddings": EmbeddingServer(service, name, metrics).embeddings}
    rerank = RerankServer(service, name, metrics).rerank
    return {"/v1/rerank": rerank, "/rerank": rerank}


def _wrong_endpoint(model_name: str, what: str, serves: tuple[str, ...]) -> Any:
    """A handler answering 400 on an endpoint this model cannot serve, naming the one it does."""

    async def wrong(request: Request) -> Any:
        return error_response(400, f"{model_name!r} is {what}, so this server answers POST "
                              f"{' and '.join(serves)}, not {request.url.path}; send the request "
                              "there, or serve a model of the kind this endpoint needs.")

    return wrong


def _one_prompt(prompt: Any) -> str | list[int]:
    """The request's one prompt (text or ids): a list of one prompt is that prompt."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        raise InputError(f"This server takes one prompt per request; got {len(prompt)}. Send one "
                         "request per prompt (they are batched together on the server).")
    return prompt


async def _events(streams: list[TextStream], ident: str, model_name: str, metrics: ServerMetrics,
                  counts: tuple[bool, bool] = (False, False)) -> AsyncIterator[str]:
    """Server-sent events: a chunk per token of each choice (its ``index``), the last of a
    choice with its finish reason, the usage chunk with ``include_usage``, then [DONE]; with
    ``continuous_usage_stats`` every chunk also carries its choice's counts so far. A request
    that failed (its time ran out, decoding failed) ends with an error event instead of the
    last chunk. A client that goes away closes this generator: its requests are cancelled,
    their rows leave."""
    head = json.dumps({"id": ident, "object": "text_completion", "created": int(time.time()),
                       "model": model_name})[:-1]
    include_usage, continuous = counts
    sent = [0] * len(streams)  # each choice's tokens sent so far

    def event(listed: list[dict], counted: dict | None = None) -> str:
        tail = f', "usage": {json.dumps(counted)}' if include_usage else ""
        return f'data: {head}, "choices": {json.dumps(listed)}{tail}}}\n\n'

    def chunk(index: int, text: str, ids: list[int], reason: str | None) -> str:
        sent[index] += len(ids)
        stream = streams[index]
        counted = usage(Usage(stream.prompt_tokens, sent[index], stream.usage.cached_tokens)
                        ) if continuous else None
        return event([{"index": index, "text": text, "token_ids": ids, "logprobs": None,
                       "finish_reason": reason}], counted)

    try:
        async with contextlib.aclosing(choices.arrivals(streams)) as arrived:
            async for index, deltas in arrived:  # several tokens' events in one write
                stream = streams[index]
                if deltas is not None:
                    yield "".join(chunk(index, d.text, [d.token_id], None) for d in deltas)
                elif (failed := failure_event(stream.failure)) is not None:
                    yield failed
                    break
                else:
                    yield chunk(index, stream.rest(), [], stream.finish_reason())
            else:
                if include_usage:
                    yield event([], usage(choices.total_usage(streams)))
        yield "data: [DONE]\n\n"
    finally:
        for stream in streams:
            stream.cancel()  # no-op when it ended; frees the row when the client left mid-stream
            metrics.finished(stream)  # still running: counted as cancelled, the engine ends it next


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
