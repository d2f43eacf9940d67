"""A request's life beyond its endpoint: the server admitting it or not (a server that drains on
``SIGTERM`` answers 503 and finishes what it holds), and its client leaving before the answer
(the request is cancelled, its batch row freed, whether it streams or not).

:class:`Admission` counts the requests in flight and, once :meth:`~Admission.close` d, refuses
new ones; :class:`AdmissionGate` is the ASGI middleware that asks it. :func:`unless_client_leaves`
waits for a non-streaming reply while watching the connection (a stream's generator is closed by
the server when its client leaves, which cancels it already).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable
from typing import Any, TypeVar

from transformer_kit.apps.serving.guard import ASGIApp, Receive, Scope, Send

T = TypeVar("T")
#: The status logged for a request whose client left before its answer (nginx's 499: no client
#: reads it).
CLIENT_LEFT = 499


class Admission:
    """Requests in flight, and whether new ones are admitted (thread-safe: the signal handler
    and the waiting thread are not the event loop's)."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self.in_flight = 0
        self.closed = False

    def enter(self) -> bool:
        """Count a new request in; False (not counted) once closed."""
        with self._changed:
            if self.closed:
                return False
            self.in_flight += 1
            return True

    def leave(self) -> None:
        with self._changed:
            self.in_flight -= 1
            self._changed.notify_all()

    def close(self) -> None:
        """Admit no more requests (those in flight go on)."""
        with self._changed:
            self.closed = True
            self._changed.notify_all()

    def drained(self, timeout: float) -> bool:
        """Wait until no request is in flight, at most ``timeout`` seconds; whether none is."""
        with self._changed:
            return self._changed.wait_for(lambda: self.in_flight == 0, timeout)


class AdmissionGate:
    """ASGI middleware: every HTTP request counted by ``admission`` while it runs (a stream until
    its last event); once the admission is closed, 503 with a sentence (``/health`` too, so that
    a load balancer stops sending)."""

    def __init__(self, app: ASGIApp, *, admission: Admission) -> None:
        self.app, self.admission = app, admission

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if not self.admission.enter():
            from transformer_kit.apps.serving.openai_api import error_response

            refusal = error_response(503, "The server is shutting down (it received SIGTERM): it "
                                     "finishes the requests it holds and takes no new ones. Send "
                                     "the request to another replica, or again once the server "
                                     "is back.", kind="server_busy", code="shutting_down",
                                     headers={"Connection": "close"})
            await refusal(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self.admission.leave()


async def unless_client_leaves(receive: Receive, reply: Awaitable[T]) -> tuple[bool, T | None]:
    """Await ``reply`` while watching the connection: (True, its result), or (False, None) when
    the client left first (``reply`` is then cancelled; the caller cancels the request itself).
    ``receive``: the request's (its body read already), which gives ``http.disconnect`` when the
    client goes."""
    answer: asyncio.Future[Any] = asyncio.ensure_future(reply)

    async def gone() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    watching = asyncio.ensure_future(gone())
    try:
        await asyncio.wait({answer, watching}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watching.cancel()
    if answer.done():
        return True, answer.result()
    answer.cancel()
    return False, None
