"""The server's door: an ASGI middleware in front of every endpoint that lets in only whom it
should (``Authorization: Bearer KEY`` when the server has an API key, compared in constant
time, as vLLM's ``--api-key``) and only what it can hold (a request body of at most
``max_body_bytes``, arriving within ``body_seconds``).

The body is read here, before any endpoint sees it: a declared ``Content-Length`` over the limit
is refused without reading a byte, a chunked body is counted as it arrives and refused at the
first byte over the limit, and a body that trickles in slower than the deadline is refused with
408. So one client's 2 GB upload or slow-loris body costs the server at most ``max_body_bytes``
and a few seconds of one connection, never its memory, and the others keep being served.
Refusals are OpenAI-style JSON errors with a sentence (401, 408, 413).
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable, Collection, MutableMapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # FastAPI is imported where a refusal is answered: the CLI imports this module
    from starlette.responses import JSONResponse

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: The largest request body taken by default: a 128K-token prompt as ids is under 1 MB of JSON,
#: and OpenAI's embeddings limit (2,048 inputs, 300K tokens) under 2 MB of text.
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
#: ... and a speech model's by default: OpenAI's bound on an uploaded audio file, 25 MB.
DEFAULT_AUDIO_BODY_BYTES = 25 * 1024 * 1024
#: The longest a request body may take to arrive, by default.
DEFAULT_BODY_SECONDS = 30.0
#: Paths answered without a key (load balancers and orchestrators probe them).
OPEN_PATHS = frozenset({"/health"})
#: The environment variable ``transformer-kit serve`` reads the key from when ``--api-key`` is absent.
API_KEY_ENV = "TRANSFORMER_KIT_API_KEY"


class _Refused(Exception):
    """A body that is refused while it is read: the status and the sentence to answer with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _error(status: int, message: str, code: str | None = None,
           headers: dict[str, str] | None = None) -> JSONResponse:
    from transformer_kit.apps.serving.openai_api import error_response

    return error_response(status, message, code=code, headers=headers)


class Guard:
    """ASGI middleware: ``app`` behind an API key (None: none) and a bound on request bodies.

    ``max_body_bytes`` and ``body_seconds`` bound what any request may send; ``open_paths``
    are served without a key.
    """

    def __init__(self, app: ASGIApp, *, api_key: str | None = None,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 body_seconds: float = DEFAULT_BODY_SECONDS,
                 open_paths: Collection[str] = OPEN_PATHS) -> None:
        if api_key is not None and not api_key.strip():
            raise ValueError("api_key is empty; give a key, or None to serve without one")
        if max_body_bytes < 1 or body_seconds <= 0:
            raise ValueError(f"max_body_bytes ({max_body_bytes}) and body_seconds ({body_seconds}) "
                             "must be positive")
        self.app, self.max_body_bytes, self.body_seconds = app, max_body_bytes, body_seconds
        self._key = api_key.encode() if api_key is not None else None
        self.open_paths = frozenset(open_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v for k, v in scope.get("headers", ())}
        refusal = self._check_key(scope["path"], headers.get("authorization"))
        if refusal is None:
            refusal = self._check_length(headers.get("content-length"))
        if refusal is None:
            try:
                body = await asyncio.wait_for(self._read(receive), self.body_seconds)
            except TimeoutError:
                refusal = _error(408, f"The request body did not arrive within {self.body_seconds:g} s; "
                                 "send it whole and promptly.")
            except _Refused as exc:
                refusal = _error(exc.status, str(exc))
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        await self.app(scope, _replay(body, receive), send)

    def _check_key(self, path: str, authorization: bytes | None) -> JSONResponse | None:
        if self._key is None or path in self.open_paths:
            return None
        scheme, _, token = (authorization or b"").partition(b" ")
        if scheme.lower() == b"bearer" and secrets.compare_digest(token.strip(), self._key):
            return None
        given = "no Authorization header" if authorization is None else "a wrong key"
        return _error(401, f"This server needs an API key, and the request had {given}; send "
                      "'Authorization: Bearer KEY' (the openai client's api_key) with the key the "
                      "server was started with.", code="invalid_api_key",
                      headers={"WWW-Authenticate": "Bearer"})

    def _check_length(self, length: bytes | None) -> JSONResponse | None:
        if length is None:
            return None
        try:
            declared = int(length)
        except ValueError:
            return _error(400, f"Content-Length {length.decode('latin-1')!r} is not a number.")
        if declared > self.max_body_bytes:
            return _error(413, self._too_large(f"{declared:,} bytes"))
        return None

    def _too_large(self, given: str) -> str:
        return (f"The request body is {given}; this server takes at most {self.max_body_bytes:,} "
                "bytes (--max-body-mb). Send less per request (several requests are batched "
                "together), or start the server with a larger limit.")

    async def _read(self, receive: Receive) -> bytes:
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _Refused(400, "The client left before its request body arrived.")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                raise _Refused(413, self._too_large(f"over {self.max_body_bytes:,} bytes"))
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives the body read already, then the client's own messages (a
    disconnect, which a streaming endpoint waits for)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
