"""A request as the serving engine holds it: the caller's handle (iterate it for tokens, await
its arrivals, cancel it) and its row's state in the running batch."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from transformer_kit.decoding import GenerationConfig, SequenceSearch

END = object()  # put on a request's stream after its last token


def wake_all(events: list[asyncio.Event]) -> None:
    """Set each event (run on their loop, by ``call_soon_threadsafe``)."""
    for event in events:
        event.set()


class WaitingQueue(queue.Queue):
    """The engine's queue of waiting requests, from which those that ended early (cancelled,
    past their time) can be taken out before their turn."""

    def take_out(self, which: Callable[[Request], bool]) -> list[Request]:
        """Remove and return the waiting requests for which ``which`` is true."""
        with self.mutex:
            out = [request for request in self.queue if which(request)]
            for request in out:
                self.queue.remove(request)
            if out:
                self.not_full.notify(len(out))
        return out


@dataclass(eq=False)  # a request is itself: two with the same fields are two requests
class Request:
    """A submitted request: iterate it for its new tokens (ints) as they are chosen.

    ``finish_reason`` is set when it ends: ``"stop"`` (an eos id or a stop string), ``"length"``
    (max_new_tokens), ``"cancelled"``, ``"timeout"`` (it ran past ``timeout`` seconds from its
    submission) or ``"error"`` (with ``"timeout"`` and ``"error"``, ``error`` says what happened).
    """

    prompt: np.ndarray  # (length,) int64
    options: GenerationConfig
    timeout: float | None = None  # most seconds from submission to the last token (None: no bound)
    submitted: float = field(default_factory=time.perf_counter)
    first_token_s: float | None = None
    cached_tokens: int = 0  # prompt tokens whose cache came from the engine's prefix cache
    finish_reason: str | None = None
    error: str | None = None
    tokens: list[int] = field(default_factory=list)
    _stream: queue.SimpleQueue = field(default_factory=queue.SimpleQueue, repr=False)
    _cancelled: threading.Event = field(default_factory=threading.Event, repr=False)
    _row: Row | None = field(default=None, repr=False)  # set by the engine
    # set by an asynchronous reader: the engine sets this event on this loop after each step
    _waker: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = field(default=None, repr=False)

    def cancel(self) -> None:
        """Stop decoding this request; its row leaves the batch at the next step boundary."""
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    @property
    def expired(self) -> bool:
        """Whether it has run past its ``timeout`` (the engine ends it at the next step boundary)."""
        return self.timeout is not None and time.perf_counter() - self.submitted > self.timeout

    def __iter__(self) -> Iterator[int]:
        while True:
            item = self._stream.get()
            if item is END:
                return
            yield item

    def result(self) -> list[int]:
        """Every new token, after waiting for the end."""
        for _ in self:
            pass
        return list(self.tokens)

    async def arrivals(self) -> AsyncIterator[list[int]]:
        """The new tokens for an asyncio reader, as lists of the tokens that came since the last
        one (a single token while the reader keeps up). The engine wakes the reader's loop once
        per step for all its requests; no thread is held while waiting."""
        event = asyncio.Event()
        self._waker = (asyncio.get_running_loop(), event)  # before the first look: no token missed
        while True:
            event.clear()  # before draining: a token put after this sets it again
            tokens = []
            while True:
                try:
                    item = self._stream.get_nowait()
                except queue.Empty:
                    break
                if item is END:
                    if tokens:
                        yield tokens
                    return
                tokens.append(item)
            if tokens:
                yield tokens
            await event.wait()


class Row:
    """One request in the batch: its search (choice and end, as ``generate`` makes them) and
    its stream."""

    def __init__(self, request: Request, search: SequenceSearch, drafting: Any = None) -> None:
        self.request, self.search = request, search
        self.last = int(request.prompt[-1])
        #: The request's prompt lookup (a :class:`~.speculation.Drafting`), or None.
        self.drafting = drafting

    def advance(self, logits: np.ndarray, draft: int | None = None) -> bool:
        """Choose and stream the next token from logits (vocab,) (``draft``: the token drafted
        for this position, if any); whether the request ended."""
        token, reason = self.search.choose(logits, draft)
        request = self.request
        if request.first_token_s is None:
            request.first_token_s = time.perf_counter() - request.submitted
        request.tokens.append(token)
        request._stream.put(token)
        self.last = token
        request.finish_reason = reason
        return reason is not None
