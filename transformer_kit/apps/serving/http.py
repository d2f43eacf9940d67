"""An HTTP server in the OpenAI convention over the runtime's :class:`~transformer_kit.runtime.Service`,
so existing clients (the ``openai`` package, curl) work unchanged.

``POST /v1/completions`` (in :mod:`.completions`: prompt as text or token ids, ``max_tokens``,
``temperature`` (0 = greedy), ``top_p``, ``seed``, ``stop``, ``stream`` as server-sent events, and
the sampling fields it shares with chat, :mod:`.sampling_fields`: ``n`` choices, OpenAI's penalties and
``logit_bias``, vLLM's ``top_k``, ``min_p``, ``min_tokens``, ``ignore_eos``...),
``POST /v1/chat/completions`` (messages rendered by the export's chat template, tools,
``response_format``; in :mod:`.chat`), ``POST /v1/responses`` (OpenAI's Responses API over the
same path, with ``previous_response_id``; ``GET`` and ``DELETE /v1/responses/{id}`` read and
forget a stored one; in :mod:`.responses`), ``POST /tokenize`` and
``POST /detokenize`` (vLLM's, :mod:`.tokenization`), ``GET /v1/models``,
``GET /health`` and ``GET /metrics`` (Prometheus text). A speech model's (Whisper's) export is
served on ``POST /v1/audio/transcriptions`` and ``/v1/audio/translations`` (multipart uploads,
:mod:`.transcriptions`), an embedding model's
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

Each endpoint family (completions, chat, responses, embeddings, rerank, tokenization) declares
its paths, request and answer models once (its module's :class:`~.routes.Family`), and
:func:`~.routes.router` routes it; the families' handlers share one decorator for what the
engine refuses and one watch over a request's streams, to their end or the client's leaving
(:mod:`.routes`).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse
from prometheus_client import Gauge, generate_latest

from transformer_kit.apps.serving import (
    chat,
    completions,
    embeddings,
    page,
    rerank,
    responses,
    tokenization,
    transcriptions,
)
from transformer_kit.apps.serving.guard import (
    DEFAULT_AUDIO_BODY_BYTES,
    DEFAULT_BODY_SECONDS,
    DEFAULT_MAX_BODY_BYTES,
    OPEN_PATHS,
    Guard,
)
from transformer_kit.apps.serving.lifecycle import Admission, AdmissionGate
from transformer_kit.apps.serving.openai_api import (
    ERROR_RESPONSES,
    ServerMetrics,
    error_response,
    install_error_handlers,
)
from transformer_kit.apps.serving.response_store import DEFAULT_STORED_RESPONSES, ResponseStore
from transformer_kit.apps.serving.routes import Family, Served, router
from transformer_kit.apps.serving.tokenization import TokenizationServer, max_model_len
from transformer_kit.core.decoding.defaults import GENERATION_CONFIG_MODES
from transformer_kit.core.errors import InputError
from transformer_kit.core.speech.audio import MAX_SECONDS
from transformer_kit.runtime import Engine, Limits, Service
from transformer_kit.runtime.adapters import ADAPTER_FOLDER


class ModelServer:
    """What every endpoint of one served model shares (its service, metrics, health and
    model list), and the endpoints' work over it, routed by ``create_app`` (which each replica of the
    Ray Serve deployment in :mod:`.ray_serve` serves too)."""

    def __init__(self, service: Service, model_name: str) -> None:
        self.service, self.model_name = service, model_name
        self.engine = service.engine
        self.metrics = ServerMetrics(service.engine)
        self.created = int(time.time())
        #: Every model the app serves, name -> its service (the base's, then its adapters':
        #: ``create_app``).
        self.served: dict[str, Service] = {model_name: service}

    async def health(self) -> dict:
        return {"status": "ok"}

    async def models(self) -> dict:
        """The served models, each as vLLM lists it (:func:`_model_card`), with
        ``generation_defaults``: the checkpoint's sampling defaults that a request's missing
        fields take ({}: none, or ``--generation-config ignore``)."""
        defaults = self.service.generation_defaults
        return {"object": "list", "data": [
            {**_model_card(name, each, self.model_name, self.created), "generation_defaults": defaults}
            for name, each in self.served.items()]}

    async def prometheus(self) -> PlainTextResponse:
        return PlainTextResponse(generate_latest(self.metrics.registry).decode(),
                                 media_type="text/plain; version=0.0.4")


def _model_card(name: str, service: Service, base: str, created: int) -> dict[str, Any]:
    """One entry of ``GET /v1/models`` in vLLM's shape: ``root`` the export folder this server
    loaded (vLLM: the model's path), or for a LoRA adapter its file in that folder (vLLM: the
    adapter's path) with ``parent`` the base model's name; ``max_model_len`` as /tokenize gives
    it (:func:`.tokenization.max_model_len`)."""
    folder = Path(service.model.path).resolve()
    adapter = service.engine.adapter
    return {"id": name, "object": "model", "created": created, "owned_by": "transformer-kit",
            "root": str(folder if adapter is None else folder / ADAPTER_FOLDER / f"{adapter}.safetensors"),
            "parent": None if adapter is None else base, "max_model_len": max_model_len(service)}


#: What each kind of model is, as the wrong endpoint's answer names it, and the endpoint families
#: it serves (every kind also serves /tokenize and /detokenize: :data:`_TOKENIZATION`).
_KINDS: dict[str, tuple[str, tuple[Family, ...]]] = {
    "generate": ("a text generator", (completions.ROUTES, chat.ROUTES, responses.ROUTES)),
    "transcribe": ("a speech model", (transcriptions.ROUTES, transcriptions.TRANSLATIONS)),
    "embeddings": ("a sentence-embedding model", (embeddings.ROUTES,)),
    "rerank": ("a cross-encoder", (rerank.ROUTES,))}
_TOKENIZATION = (tokenization.TOKENIZE, tokenization.DETOKENIZE)


def create_app(engine: Engine, model_name: str, *, api_key: str | None = None,
               max_body_bytes: int | None = None, max_audio_seconds: float = MAX_SECONDS,
               body_seconds: float = DEFAULT_BODY_SECONDS, max_prompt_tokens: int | None = None,
               max_request_seconds: float | None = None,
               stored_responses: int = DEFAULT_STORED_RESPONSES,
               adapters: dict[str, Engine] | None = None, generation_config: str = "auto") -> FastAPI:
    """The FastAPI application serving ``engine`` under the model name ``model_name``: a
    decoder's on the completions endpoints, a speech model's on /v1/audio/transcriptions and
    /v1/audio/translations, an embedding model's on /v1/embeddings, a cross-encoder's on
    /v1/rerank (the engine's ``kind``). Behind a :class:`.Guard`: ``api_key`` (None: none)
    needed on every endpoint but /health and a decoder's chat page (at /), request bodies of at
    most ``max_body_bytes`` (None: 4 MiB, a speech model's 25 MiB, OpenAI's bound on an audio
    file) arriving within ``body_seconds``; audio files of at most ``max_audio_seconds``. A
    prompt (a completion's, a chat's rendered conversation) may hold at most
    ``max_prompt_tokens`` tokens (None: the model's context length, else
    :data:`~transformer_kit.runtime.limits.DEFAULT_MAX_PROMPT_TOKENS`; more: 400), and any
    request may take at most ``max_request_seconds`` from arrival to its end (None: no bound;
    past it the engine stops it and frees its row: 504, or an error event ending the stream).
    Embeddings and rerank keep their own bound on texts (the model's positions).
    ``/v1/responses`` keeps the last ``stored_responses`` responses (0: none) for
    ``previous_response_id``, in memory (one store for the base and its adapters).
    ``generation_config``: "auto" (a request's missing sampling fields take the checkpoint's
    generation_config.json values, as vLLM's ``--generation-config auto``; listed in
    ``/v1/models``) or "ignore" (OpenAI's defaults). Raises InputError for a bound that is not
    positive or another ``generation_config``.

    ``adapters``: a decoder's engines per LoRA adapter (``Engine(model, adapter=name)``), each
    served as the model ``MODEL_NAME:NAME``: GET /v1/models lists them after the base, and a
    request's ``model`` picks the engine, whose rows are batched together."""
    limits = Limits.of(engine.model.context_length, max_prompt_tokens, max_request_seconds,
                       max_audio_seconds)
    if max_body_bytes is None:
        max_body_bytes = DEFAULT_AUDIO_BODY_BYTES if engine.kind == "transcribe" else DEFAULT_MAX_BODY_BYTES
    if generation_config not in GENERATION_CONFIG_MODES:
        raise InputError(f"generation_config is {generation_config!r}; give one of "
                         f"{', '.join(GENERATION_CONFIG_MODES)}.")
    auto = generation_config == "auto"
    service = Service(engine, limits, generation_defaults=auto)
    served = {f"{model_name}:{name}": ModelServer(Service(other, limits, generation_defaults=auto),
                                                       f"{model_name}:{name}")
              for name, other in (adapters or {}).items()}
    app = FastAPI(title="transformer-kit", docs_url=None, redoc_url=None, responses=ERROR_RESPONSES)
    app.add_middleware(Guard, api_key=api_key, max_body_bytes=max_body_bytes,
                       body_seconds=body_seconds, open_paths=OPEN_PATHS | page.PATHS)
    #: Requests in flight; ``transformer-kit serve`` closes it on SIGTERM (503 from then on).
    app.state.admission = Admission()
    app.add_middleware(AdmissionGate, admission=app.state.admission)  # outermost: counts all
    families = [family for _, kind in _KINDS.values() for family in kind] + list(_TOKENIZATION)
    install_error_handlers(app, {path: family.request for family in families for path in family.paths})
    server = ModelServer(service, model_name)
    Gauge("transformer_kit_http_requests_in_flight", "HTTP requests being answered (a stream "
          "until its last event)", registry=server.metrics.registry
          ).set_function(lambda: app.state.admission.in_flight)
    store = ResponseStore(stored_responses)
    served = {model_name: Served(service, model_name, server.metrics, store),
              **{f"{model_name}:{name}": Served(Service(other, limits, generation_defaults=auto),
                                                 f"{model_name}:{name}", ServerMetrics(other), store)
                 for name, other in (adapters or {}).items()}}
    server.served = {name: each.service for name, each in served.items()}
    app.get("/health")(server.health)
    app.get("/v1/models")(server.models)
    app.get("/metrics", response_class=PlainTextResponse)(server.prometheus)
    app.get("/tokenizer_info", response_model=None)(TokenizationServer(served[model_name]).tokenizer_info)
    what, serves = _KINDS[service.kind]
    for family in (*serves, *_TOKENIZATION):
        app.include_router(router(family, served))
    if service.kind == "generate":
        stored = responses.StoredResponses(store, server.metrics)  # one store for the base and its adapters
        app.get("/v1/responses/{response_id}", response_model=None,
                responses={200: {"model": responses.ResponseObject}})(stored.retrieve)
        app.delete("/v1/responses/{response_id}", response_model=None,
                   responses={200: {"model": responses.DeletedResponse}})(stored.delete)
        page.add_page(app)  # the chat page at /, open without the key (it carries no secret)
    paths = tuple(path for family in serves for path in family.paths)
    for other, (_, kind) in _KINDS.items():
        for family in kind if other != service.kind else ():
            for path in family.paths:
                app.post(path, response_model=None, include_in_schema=False)(
                    _wrong_endpoint(model_name, what, paths))
    app.state.server, app.state.responses = server, store
    return app


def _wrong_endpoint(model_name: str, what: str, serves: tuple[str, ...]) -> Any:
    """A handler answering 400 on an endpoint this model cannot serve, naming the one it does."""

    async def wrong(request: Request) -> Any:
        return error_response(400, f"{model_name!r} is {what}, so this server answers POST "
                              f"{' and '.join(serves)}, not {request.url.path}; send the request "
                              "there, or serve a model of the kind this endpoint needs.")

    return wrong


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
