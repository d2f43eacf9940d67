"""A request as the engine takes it: the caller's handle, one contract for every kind.

Every request ends once, with ``finish_reason``: ``"stop"`` (an eos id or a stop string; a
pooling request's rows are ready), ``"length"`` (``max_new_tokens``), ``"cancelled"`` (its
caller cancelled it, or the engine closed), ``"timeout"`` (it ran past ``timeout`` seconds from
its submission) or ``"error"``; with ``"timeout"`` and ``"error"``, ``error`` says what
happened. Any thread may wait for the end (:meth:`Request.wait`), an asyncio task may await it
(:meth:`Request.finished`): the engine wakes each event loop once per step for all its
requests, so no thread is held while waiting.

A :class:`GenerationRequest` streams its new tokens as they are chosen (its :class:`Row` is its
place in the engine's running batch); a :class:`PoolingRequest` gets its inputs' rows (vectors
or scores) at its end.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from transformer_kit.core.decoding import GenerationConfig, SequenceSearch
from transformer_kit.core.decoding.logprobs import TokenLogprob

END = object()  # put on a generation request's stream after its last token


def wake_all(events: list[asyncio.Event]) -> None:
    """Set each event (run on their loop, by ``call_soon_threadsafe``)."""
    for event in events:
        event.set()


class WaitingQueue(queue.Queue):
    """The engine's queue of waiting work, from which the work of requests that ended early
    (cancelled, past their time) can be taken out before its turn."""

    def take_out(self, which: Callable[[object], bool]) -> list:
        """Remove and return the waiting items for which ``which`` is true."""
        with self.mutex:
            out = [item for item in self.queue if which(item)]
            for item in out:
                self.queue.remove(item)
            if out:
                self.not_full.notify(len(out))
        return out


@dataclass(frozen=True)
class Failure:
    """Why a request gave no (or no whole) answer: ``reason`` "timeout", "error" or
    "cancelled" (a pooling request only: it has no partial answer), and a sentence saying what
    happened and what to do."""

    reason: str
    message: str


@dataclass(eq=False, kw_only=True)  # a request is itself: two with the same fields are two
class Request:
    """A submitted request of any kind (see the module's docstring for how it ends)."""

    timeout: float | None = None  # most seconds from submission to the end (None: no bound)
    submitted: float = field(default_factory=time.perf_counter)
    finish_reason: str | None = None
    error: str | None = None
    cancel_event: threading.Event = field(default_factory=threading.Event, repr=False)
    done_event: threading.Event = field(default_factory=threading.Event, repr=False)
    #: Set by an asynchronous reader: the engine sets this event on this loop after each step.
    waker: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = field(default=None, repr=False)

    def cancel(self) -> None:
        """Stop this request; it leaves the engine at the next step boundary (no-op once ended)."""
        self.cancel_event.set()

    @property
    def cancelled(self) -> bool:
        return self.cancel_event.is_set()

    @property
    def expired(self) -> bool:
        """Whether it has run past its ``timeout`` (the engine ends it at the next step boundary)."""
        return self.timeout is not None and time.perf_counter() - self.submitted > self.timeout

    @property
    def ending(self) -> str | None:
        """Why it must end before its work is done: past its time, or cancelled (None: neither)."""
        if self.expired:
            return "timeout"
        return "cancelled" if self.cancelled else None

    @property
    def done(self) -> bool:
        return self.done_event.is_set()

    def end(self, reason: str | None, error: str | None = None) -> None:
        """The engine's last word: the finish reason (None: the one already set) and error."""
        if reason is not None:
            self.finish_reason = reason
        self.error = error
        self.done_event.set()

    @property
    def failure(self) -> Failure | None:
        """How it failed, once ended: past its time, or its step failed (None: it did not)."""
        if self.finish_reason == "timeout":
            return Failure("timeout", f"{self.error} {self.shorter}, or retry when the server is "
                           "less busy; the bound is the server's --max-request-seconds.")
        if self.finish_reason == "error":
            return Failure("error", f"{self.work} failed: {self.error}")
        return None

    #: What a request that ran out of time can ask for instead, and what its work is.
    shorter = "Ask for fewer tokens (max_tokens)"
    work = "Decoding"

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the request ends (at most ``timeout`` seconds); whether it ended."""
        return self.done_event.wait(timeout)

    def listen(self) -> asyncio.Event:
        """An event the engine sets on the running loop after each step of this request and at
        its end (cleared by the reader before it looks)."""
        if self.waker is None:
            self.waker = (asyncio.get_running_loop(), asyncio.Event())
        return self.waker[1]

    async def finished(self) -> None:
        """Wait, in an asyncio task, for the request to end (no thread held)."""
        event = self.listen()  # before the first look: no end missed
        while not self.done:
            event.clear()
            if self.done:
                break
            await event.wait()


@dataclass(eq=False, kw_only=True)
class GenerationRequest(Request):
    """A prompt being decoded: iterate it for its new tokens (ints) as they are chosen."""

    prompt: np.ndarray  # (length,) int64
    options: GenerationConfig
    first_token_s: float | None = None
    cached_tokens: int = 0  # prompt tokens whose cache came from the engine's prefix cache
    tokens: list[int] = field(default_factory=list)
    stream: queue.SimpleQueue = field(default_factory=queue.SimpleQueue, repr=False)
    #: With the option ``logprobs``: each new token's report, ``logprobs[i]`` of ``tokens[i]``.
    logprobs: list[TokenLogprob] = field(default_factory=list)
    #: How many of the most likely tokens to report at each prompt position (None: no report).
    prompt_top: int | None = None
    #: With ``prompt_top``: each prompt token's report (the first None), set at prefill.
    prompt_logprobs: list[TokenLogprob | None] | None = None

    def deliver(self, token: int, report: TokenLogprob | None = None) -> None:
        """The engine's new token for this request (``report``: its log probability report)."""
        if self.first_token_s is None:
            self.first_token_s = time.perf_counter() - self.submitted
        if report is not None:
            self.logprobs.append(report)  # before the token is streamed: a reader finds both
        self.tokens.append(token)
        self.stream.put(token)

    def end(self, reason: str | None, error: str | None = None) -> None:
        super().end(reason, error)
        self.stream.put(END)

    def __iter__(self) -> Iterator[int]:
        while True:
            item = self.stream.get()
            if item is END:
                return
            yield item

    async def prefilled(self) -> None:
        """Wait, in an asyncio task, until the prompt's reports are in (``prompt_top``), its
        first token came, or it ended."""
        event = self.listen()  # before the first look: no wake-up missed
        while self.prompt_logprobs is None and not self.tokens and not self.done:
            event.clear()
            if self.prompt_logprobs is not None or self.tokens or self.done:
                break
            await event.wait()

    def result(self) -> list[int]:
        """Every new token, after waiting for the end."""
        for _ in self:
            pass
        return list(self.tokens)

    async def arrivals(self) -> AsyncIterator[list[int]]:
        """The new tokens for an asyncio reader, as lists of the tokens that came since the last
        one (a single token while the reader keeps up)."""
        event = self.listen()  # before the first look: no token missed
        while True:
            event.clear()  # before draining: a token put after this sets it again
            tokens = []
            while True:
                try:
                    item = self.stream.get_nowait()
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


@dataclass(eq=False, kw_only=True)
class PoolingRequest(Request):
    """Inputs to embed or score: ``tokens[i]`` the ids of input i, ``extras[i]`` as long (the
    pooled positions of an embedding input, the token types of a (query, document) pair).
    ``rows`` holds its (n, dim) vectors or (n, num_labels) scores, float32, once it ends with
    ``"stop"``."""

    tokens: list[list[int]]
    extras: list[list[int]]
    rows: np.ndarray | None = None

    shorter = "Send fewer or shorter inputs"
    work = "Running the model"

    @property
    def token_count(self) -> int:
        return sum(map(len, self.tokens))

    @property
    def failure(self) -> Failure | None:
        """As a request's, and "cancelled" too: a pooling request has no partial answer."""
        if self.finish_reason == "cancelled":
            return Failure("cancelled", "The server stopped before this request ran; send it again.")
        return super().failure


class Row:
    """One generation request in the batch: its search (choice and end, as ``generate`` makes
    them), its last token, its prompt lookup (a :class:`~.speculation.Drafting`, or None) and,
    for a speech model, its ``source`` (features (1, channels, frames) the encoder runs on at
    its prefill)."""

    def __init__(self, request: GenerationRequest, search: SequenceSearch, drafting: Any = None,
                 source: np.ndarray | None = None) -> None:
        self.request, self.search, self.drafting, self.source = request, search, drafting, source
        self.last = int(request.prompt[-1])
        #: The cache columns the row may come to hold: its prompt and every token it may add.
        self.columns = len(request.prompt) + request.options.max_new_tokens

    @property
    def prompt(self) -> np.ndarray:
        return self.request.prompt

    def advance(self, logits: np.ndarray, draft: int | None = None) -> bool:
        """Choose and stream the next token from logits (vocab,) (``draft``: the token drafted
        for this position, if any); whether the request ended (its finish reason set)."""
        token, reason = self.search.choose(logits, draft)
        self.request.deliver(token, self.search.report)
        self.last = token
        self.request.finish_reason = reason
        return reason is not None
