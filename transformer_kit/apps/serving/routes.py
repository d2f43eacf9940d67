"""How an endpoint family is served, declared once for all of them: a :class:`Family` names its
paths, its request and answer models (both in ``/openapi.json``) and the handler of its server;
:func:`router` routes a request to the server of the model it names (the base or a LoRA
adapter's; 404 for another name); :func:`endpoint` is the decorator every handler wears, which
answers what the engine refuses (503 queue full, 400 a sentence) and a request that ends without
its answer (:class:`Unanswered`: its client left, or it failed); :func:`settled` and
:func:`streamed` watch a request's streams to its end, whether it streams or not, and cancel and
count each there (a client that leaves frees its batch rows at once).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Protocol, TypeVar

from fastapi import APIRouter, Form, Request, Response
from fastapi.responses import StreamingResponse
from pydantic import BaseModel

from transformer_kit.apps.serving.lifecycle import CLIENT_LEFT, unless_client_leaves
from transformer_kit.apps.serving.openai_api import ServerMetrics, failure_response, unknown_model
from transformer_kit.apps.serving.response_store import ResponseStore
from transformer_kit.core.errors import InputError
from transformer_kit.runtime import QueueFull, Service
from transformer_kit.runtime.text_stream import TextStream

T = TypeVar("T")


@dataclass(frozen=True)
class Served:
    """What a family's server works over: one served model's ``service`` and ``name``, the app's
    ``metrics`` and its Responses ``store`` (one for the base and its adapters)."""

    service: Service
    name: str
    metrics: ServerMetrics
    store: ResponseStore


class Unanswered(Exception):
    """A request that ends without its answer: ``response`` is what it gets instead (499 for a
    client that left, the failure's status for one that failed)."""

    def __init__(self, response: Response) -> None:
        super().__init__(response.status_code)
        self.response = response


class Handled(Protocol):
    """A family's server, as :func:`endpoint` reads it."""

    metrics: ServerMetrics


def endpoint(handler: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """The decorator of every family's handler ``(self, body, request)``: a request the engine
    would not take (``QueueFull``: 503; ``InputError``: 400 with its sentence) is answered and
    counted by the server's metrics, and one that ended :class:`Unanswered` gets its response."""

    @functools.wraps(handler)
    async def answer(self: Handled, body: BaseModel, request: Request) -> Any:
        try:
            return await handler(self, body, request)
        except (QueueFull, InputError) as exc:
            return self.metrics.refused(exc)
        except Unanswered as ended:
            return ended.response

    return answer


def _finished(streams: list[TextStream], metrics: ServerMetrics) -> None:
    """Cancel each stream (a no-op when it ended; its row leaves the batch when it had not) and
    count it (still running: as cancelled)."""
    for stream in streams:
        stream.cancel()
        metrics.finished(stream)


async def settled(request: Request, streams: list[TextStream], metrics: ServerMetrics,
                  replies: Awaitable[T]) -> T:
    """``replies`` (the streams' text) once they end, the client watched meanwhile; every
    stream then cancelled and counted. Raises :class:`Unanswered` when the client left first
    (499) or a stream failed (its status: 504 past its time, 500 a failed step)."""
    answered, value = await unless_client_leaves(request.receive, replies)
    _finished(streams, metrics)
    if not answered:
        raise Unanswered(Response(status_code=CLIENT_LEFT))
    for stream in streams:
        if (failed := failure_response(stream.failure)) is not None:
            raise Unanswered(failed)
    return value


def streamed(events: AsyncIterator[str], streams: list[TextStream],
             metrics: ServerMetrics) -> StreamingResponse:
    """``events`` as server-sent events; when they end, or the client goes away (the server then
    closes the generator), every stream is cancelled and counted."""

    async def watched() -> AsyncIterator[str]:
        try:
            async with contextlib.aclosing(events) as each:
                async for event in each:
                    yield event
        finally:
            _finished(streams, metrics)

    return StreamingResponse(watched(), media_type="text/event-stream")


@dataclass(frozen=True)
class Family:
    """An endpoint family as :func:`router` serves it: a ``server`` per served model, built over
    its :class:`Served`, whose ``handler`` (an :func:`endpoint`) answers ``POST`` on each of
    ``paths`` a body of ``request`` (JSON, or with ``form`` a multipart form: an upload), with
    ``answer`` (None: JSON the schema leaves open) and, when it ``streams``, server-sent events."""

    server: Callable[[Served], Any]
    handler: Callable[..., Awaitable[Any]]
    paths: tuple[str, ...]
    request: type[BaseModel]
    answer: type[BaseModel] | None = None
    streams: bool = False
    form: bool = False

    def answers(self) -> dict[int | str, dict]:
        """The 200 answer in the OpenAPI schema (the fuzz test checks every answer against it)."""
        answer: dict[str, Any] = {} if self.answer is None else {"model": self.answer}
        if self.streams:
            answer["content"] = {"text/event-stream": {}}
        return {200: answer} if answer else {}


def router(family: Family, served: Mapping[str, Served]) -> APIRouter:
    """``family``'s routes over every served model (name -> its :class:`Served`, the base's
    first): a request's ``model`` picks the server (a body whose ``model`` may be left out, as
    /tokenize's, is the base's), an unknown name is 404 naming every served model."""
    servers = {name: family.server(each) for name, each in served.items()}
    base, names = next(iter(servers)), ", ".join(servers)

    async def route(body: BaseModel, request: Request) -> Any:
        given = getattr(body, "model", None)
        name = base if given is None else given
        server = servers.get(name)
        if server is None:
            return unknown_model(name, names)
        return await family.handler(server, body, request)

    body = Annotated[family.request, Form()] if family.form else family.request
    route.__annotations__ = {"body": body, "request": Request, "return": Any}
    routes = APIRouter()
    for path in family.paths:
        routes.add_api_route(path, route, methods=["POST"], response_model=None,
                             responses=family.answers(), name=family.handler.__name__)
    return routes
