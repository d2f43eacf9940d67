"""The OpenAI-style server (completions and chat, or embeddings, or rerank: what the export
serves) as a Ray Serve deployment:
replicas (or autoscaling), one engine per replica, Ray's proxy spreading requests over them.
Runs on a local Ray instance or on a Ray cluster of many machines (``ray start --head`` on one,
``ray start --address HEAD:6379`` on the others, then this from any of them with ``RAY_ADDRESS``
naming the head: :func:`connect`); each replica loads the export folder from its own path, so the
folder must exist on every machine (a shared file system, or copied to the same path). Every node
with a replica runs a proxy that takes requests (:func:`proxy_host`), and every proxy spreads them
over all the replicas, its own node's and the others' (:data:`RUNTIME_ENV`).

    transformer-kit serve DIR --ray --replicas 2 --api-key KEY

Each replica serves the very application the one-process server does (:func:`.create_app`,
behind its :class:`.Guard`: the API key, the bound on request bodies), built in the replica
after its engine (Ray Serve's late-bound ingress, ``__serve_build_asgi_app__``), so the key and
the limits given to :func:`application` apply there. Every answer names the replica that gave
it in the ``x-replica`` header. A replica that dies (its process killed, its machine lost) ends
the streams it was sending with a broken connection, which a client sees as an error, never as
a finished answer; Ray Serve starts a replica in its place, and the others keep serving.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ray import serve

from transformer_kit.apps.serving.guard import ASGIApp, Message, Receive, Scope, Send
from transformer_kit.core.speech.audio import MAX_SECONDS

if TYPE_CHECKING:
    from fastapi import FastAPI

#: The response header naming the replica that answered (Ray Serve's replica id, unique within
#: the deployment; its actor is ``SERVE_REPLICA::APP#CompletionDeployment#ID`` in Ray).
REPLICA_HEADER = "x-replica"


#: The environment of the job's actors (Serve's controller, and the proxies it starts, inherit
#: it): each proxy chooses among all the replicas by their queues. Ray Serve's proxies otherwise
#: send a request to a replica of their own node whenever one takes it (up to its
#: ``max_ongoing_requests``, the engine's batch and queue here), so that requests through one node's
#: address never reached the replicas of the others (64 requests, 16 at a time, through the head
#: of two nodes: all to the head's replica).
RUNTIME_ENV = {"env_vars": {"RAY_SERVE_PROXY_PREFER_LOCAL_NODE_ROUTING": "0"}}


def connect(address: str | None = None) -> bool:
    """``ray.init`` for the deployment, with :data:`RUNTIME_ENV`: the Ray cluster at ``address``
    (default: the ``RAY_ADDRESS`` environment variable) where one is named, else a new local
    instance of this process's own, never a cluster that only happens to run on this machine (the
    one ``ray start`` recorded in /tmp/ray/ray_current_cluster). Whether it joined a cluster."""
    import ray

    address = address or os.environ.get("RAY_ADDRESS") or None
    ray.init(address=address or "local", runtime_env=RUNTIME_ENV)
    return address is not None


def proxy_host(host: str, cluster: bool) -> str:
    """The address every node's proxy listens on when the server is to listen on ``host``. Ray
    Serve gives all the proxies one address, so on a cluster an address of one machine (neither
    loopback nor every interface: the head's 10.0.0.1, or a name) would fail to bind on the other
    nodes; it becomes every interface of its family there (0.0.0.0, or :: for IPv6), which every
    node has. On one machine, and for loopback or every interface, ``host`` itself."""
    if not cluster or host == "localhost":
        return host
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:  # a name: one machine's
        return "0.0.0.0"
    if ip.is_loopback or ip.is_unspecified:
        return host
    return "::" if ip.version == 6 else "0.0.0.0"


class ReplicaHeader:
    """ASGI middleware: every HTTP answer of ``app`` carries ``x-replica: REPLICA``."""

    def __init__(self, app: ASGIApp, replica: str) -> None:
        self.app, self.header = app, (REPLICA_HEADER.encode(), replica.encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_named(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), self.header]}
            await send(message)

        await self.app(scope, receive, send_named)


def _sized_to_the_replica() -> Any:
    """Session options whose thread pool has as many threads as the CPUs Ray gave this replica
    (``num_cpus``), or None (onnxruntime's default, a thread per core) where Ray gave none: two
    replicas of one core each on a 2-core machine, each with a thread per core, would run 4
    threads on 2 cores."""
    import onnxruntime as ort
    import ray

    cpus = ray.get_runtime_context().get_assigned_resources().get("CPU")
    if not cpus:
        return None
    options = ort.SessionOptions()
    options.intra_op_num_threads = max(1, round(cpus))
    return options


@serve.deployment
@serve.ingress()
class CompletionDeployment:
    """One replica: an engine over the export and the application of :func:`.create_app`.
    ``/metrics`` answers for the replica that gets the request."""

    def __init__(self, folder: str, model_name: str, max_batch: int, max_queue: int,
                 providers: str = "auto", api_key: str | None = None,
                 max_body_bytes: int | None = None, max_prompt_tokens: int | None = None,
                 max_request_seconds: float | None = None, prefix_cache_bytes: int = 0,
                 prompt_lookup_num_tokens: int | None = None,
                 max_audio_seconds: float = MAX_SECONDS) -> None:
        from transformer_kit.runtime import Engine, OnnxModel

        model = OnnxModel(folder, providers=providers, session_options=_sized_to_the_replica())
        self.engine = Engine(model, max_batch=max_batch, max_queue=max_queue,
                             prefix_cache_bytes=prefix_cache_bytes,
                             prompt_lookup_num_tokens=prompt_lookup_num_tokens)
        self.model_name, self.api_key, self.max_body_bytes = model_name, api_key, max_body_bytes
        self.max_prompt_tokens, self.max_request_seconds = max_prompt_tokens, max_request_seconds
        self.max_audio_seconds = max_audio_seconds

    def __serve_build_asgi_app__(self) -> FastAPI:
        """The replica's application (Ray Serve calls this once, after ``__init__``)."""
        from transformer_kit.apps.serving.http import create_app

        app = create_app(self.engine, self.model_name, api_key=self.api_key,
                         max_body_bytes=self.max_body_bytes, max_prompt_tokens=self.max_prompt_tokens,
                         max_request_seconds=self.max_request_seconds,
                         max_audio_seconds=self.max_audio_seconds)
        app.add_middleware(ReplicaHeader, replica=serve.get_replica_context().replica_id.unique_id)
        return app


def application(folder: str | Path, model_name: str, *, replicas: int = 1, max_batch: int = 16,
                max_queue: int = 64, num_cpus: float = 1.0, autoscaling: dict | None = None,
                providers: str = "auto", api_key: str | None = None,
                max_body_bytes: int | None = None, max_prompt_tokens: int | None = None,
                max_request_seconds: float | None = None,
                prefix_cache_bytes: int = 0,
                prompt_lookup_num_tokens: int | None = None,
                max_audio_seconds: float = MAX_SECONDS) -> serve.Application:
    """The deployment bound to an export folder: ``replicas`` copies, or Ray Serve's
    ``autoscaling_config`` (e.g. ``{"min_replicas": 1, "max_replicas": 4,
    "target_ongoing_requests": 16}``) instead; ``num_cpus`` Ray reserves for each replica.
    ``api_key`` (None: none) is needed on every endpoint but /health, request bodies are of
    at most ``max_body_bytes`` (None: as :func:`.create_app` bounds them), prompts of at most
    ``max_prompt_tokens`` tokens, audio of at most ``max_audio_seconds`` and requests of at
    most ``max_request_seconds``, as with :func:`.create_app`; each replica's engine keeps a
    prefix cache of at most ``prefix_cache_bytes`` (0: none) and drafts by prompt lookup for
    requests that set none with ``prompt_lookup_num_tokens`` (None: only those that ask)."""
    if api_key is not None and not api_key.strip():
        raise ValueError("api_key is empty; give a key, or None to serve without one")
    if max_body_bytes is not None and max_body_bytes < 1:
        raise ValueError(f"max_body_bytes must be positive, got {max_body_bytes}")
    scale = {"autoscaling_config": autoscaling} if autoscaling else {"num_replicas": replicas}
    deployment = CompletionDeployment.options(ray_actor_options={"num_cpus": num_cpus},
                                              max_ongoing_requests=max_batch + max_queue, **scale)
    return deployment.bind(str(Path(folder).resolve()), model_name, max_batch, max_queue, providers,
                           api_key, max_body_bytes, max_prompt_tokens, max_request_seconds,
                           prefix_cache_bytes, prompt_lookup_num_tokens, max_audio_seconds)
