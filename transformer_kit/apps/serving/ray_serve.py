"""The OpenAI-style server (completions and chat completions) as a Ray Serve deployment:
replicas (or autoscaling), one engine per replica, Ray's proxy spreading requests over them.
Runs on a local Ray instance or on a Ray cluster of many machines (``ray start --head`` on one,
``ray start --address HEAD:6379`` on the others, then this from any of them); each replica loads
the export folder from its own path, so the folder must exist on every machine (a shared file
system, or copied to the same path).

    transformer-kit serve DIR --ray --replicas 2
"""

# No ``from __future__ import annotations`` here: Ray Serve's class ingress rebuilds the methods'
# signatures, and FastAPI must see the request model as a class (as a string, the body would be
# taken for a query parameter).
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from ray import serve

from transformer_kit.apps.serving.chat import ChatCompletionRequest, ChatServer
from transformer_kit.apps.serving.engine import Engine
from transformer_kit.apps.serving.http import CompletionRequest, CompletionServer
from transformer_kit.apps.serving.openai_api import Limits, install_error_handlers

ingress = FastAPI(title="transformer-kit", docs_url=None, redoc_url=None)
install_error_handlers(ingress, {"/v1/completions": CompletionRequest,
                                 "/v1/chat/completions": ChatCompletionRequest})


@serve.deployment
@serve.ingress(ingress)
class CompletionDeployment:
    """One replica: an engine over the export and the endpoints of :mod:`.http`. ``/metrics``
    answers for the replica that gets the request."""

    def __init__(self, folder: str, model_name: str, max_batch: int, max_queue: int,
                 providers: str = "auto", max_prompt_tokens: int | None = None,
                 max_request_seconds: float | None = None) -> None:
        from transformer_kit.export import OnnxModel

        model = OnnxModel(folder, providers=providers)
        limits = Limits.of(model.context_length, max_prompt_tokens, max_request_seconds)
        self.server = CompletionServer(Engine(model, max_batch=max_batch, max_queue=max_queue),
                                       model_name, limits)
        self.chat = ChatServer(self.server.engine, model_name, self.server.metrics, limits)

    @ingress.get("/health")
    async def health(self) -> dict:
        return await self.server.health()

    @ingress.get("/v1/models")
    async def models(self) -> dict:
        return await self.server.models()

    @ingress.get("/metrics")
    async def prometheus(self) -> Any:
        return await self.server.prometheus()

    @ingress.post("/v1/completions", response_model=None)
    async def completions(self, body: CompletionRequest) -> Any:
        return await self.server.completions(body)

    @ingress.post("/v1/chat/completions", response_model=None)
    async def chat_completions(self, body: ChatCompletionRequest) -> Any:
        return await self.chat.chat_completions(body)


def application(folder: str | Path, model_name: str, *, replicas: int = 1, max_batch: int = 16,
                max_queue: int = 64, num_cpus: float = 1.0, autoscaling: dict | None = None,
                providers: str = "auto", max_prompt_tokens: int | None = None,
                max_request_seconds: float | None = None) -> serve.Application:
    """The deployment bound to an export folder: ``replicas`` copies, or Ray Serve's
    ``autoscaling_config`` (e.g. ``{"min_replicas": 1, "max_replicas": 4,
    "target_ongoing_requests": 16}``) instead; ``num_cpus`` Ray reserves for each replica.
    ``max_prompt_tokens`` and ``max_request_seconds``: each replica's bounds, as
    :func:`~.http.create_app`'s."""
    scale = {"autoscaling_config": autoscaling} if autoscaling else {"num_replicas": replicas}
    deployment = CompletionDeployment.options(ray_actor_options={"num_cpus": num_cpus},
                                              max_ongoing_requests=max_batch + max_queue, **scale)
    return deployment.bind(str(Path(folder).resolve()), model_name, max_batch, max_queue, providers,
                           max_prompt_tokens, max_request_seconds)
