"""The chat page of ``transformer-kit serve``, at ``/``: a conversation with the served model in a
browser, streamed from ``POST /v1/chat/completions``, with a system prompt, temperature, maximum
tokens, stop strings, the model's reasoning shown apart from its answer, and the API key when
the server has one. Plain HTML, CSS and JavaScript shipped in the package (no build step, nothing
fetched from elsewhere).

The page's files carry no secret, so they are served without the key (:data:`PATHS`, which the
server's :class:`.Guard` leaves open); everything the page asks the server for needs the key as
any client's request does. The page keeps the key in its memory only (a password field, sent as
``Authorization: Bearer``, never in a URL or the browser's storage) and puts the user's and the
model's text in the page as text, never parsed as HTML; its Content-Security-Policy lets it run
only its own script and talk only to its own server.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from importlib.resources import files

from fastapi import FastAPI, Response

#: The page's files by the path they are served at: (file name in this package, media type).
FILES = {"/": ("index.html", "text/html; charset=utf-8"),
         "/chat.js": ("chat.js", "text/javascript; charset=utf-8"),
         "/chat.css": ("chat.css", "text/css; charset=utf-8")}
#: The paths served without the API key.
PATHS = frozenset(FILES)
#: Sent with each file: the page runs its own script and styles only, connects to its own server
#: only, and cannot be framed by another site.
HEADERS = {"Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
           "connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; "
           "frame-ancestors 'none'",
           "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
           "Cache-Control": "no-cache"}


def add_page(app: FastAPI) -> None:
    """Serve the chat page's files on ``app`` at :data:`PATHS` (``GET``, outside the API schema)."""
    for path, (name, media_type) in FILES.items():
        body = files(__name__).joinpath(name).read_bytes()
        app.get(path, include_in_schema=False)(_file(body, media_type))


def _file(body: bytes, media_type: str) -> Callable[[], Awaitable[Response]]:
    """A handler answering ``body`` as ``media_type``."""

    async def page_file() -> Response:
        return Response(body, media_type=media_type, headers=HEADERS)

    return page_file
