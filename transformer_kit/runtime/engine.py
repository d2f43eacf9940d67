"""One engine for every kind of request: generation (continuous batching over a decoder) and
pooling (embeddings, a cross-encoder's scores, batched across callers).

The engine owns the lifecycle every kind shares: a bounded queue, one thread running the loop,
a bounded time per request (``timeout``: past it the request ends with ``"timeout"`` at the next
step boundary, waiting or running), cancellation, closing, a failed step that ends its requests
with ``"error"`` (logged with its traceback) while the engine goes on, the wake-up of asyncio
readers once per step per event loop, and typed counters (:class:`~.stats.EngineStats`). What
a step does is the kind's: :class:`~.continuous_batching.ContinuousBatch` for a decoder,
:class:`~.pooling.PoolingCalls` for an embedding model or a cross-encoder. The requests end by
one contract (:mod:`.requests`). ``submit`` may be called from any thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import threading
from typing import Any

from transformer_kit.core.embedding.api import DEFAULT_BATCH_TOKENS
from transformer_kit.core.errors import InputError, TransformerKitError
from transformer_kit.runtime.continuous_batching import ContinuousBatch
from transformer_kit.runtime.onnx_model import OnnxModel
from transformer_kit.runtime.pooling import Kind, PoolingCalls, model_kind
from transformer_kit.runtime.requests import (
    GenerationRequest,
    PoolingRequest,
    Request,
    WaitingQueue,
    wake_all,
)
from transformer_kit.runtime.stats import EngineStats


def default_cache_bytes() -> int:
    """A quarter of this machine's memory: the running batch's cache bound where none is given."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4


#: The kinds whose requests decode in the continuous batch.
DECODING = ("generate", "transcribe")


class QueueFull(TransformerKitError):
    """The engine's queue holds ``max_queue`` requests already; try again later."""


#: What each kind's requests are, as a refusal names them.
_SERVES = {"generate": "generation requests (submit)",
           "transcribe": "speech windows to decode (submit with a source)",
           "embeddings": "pooling requests (submit_pooling): sentence embeddings",
           "rerank": "pooling requests (submit_pooling): a cross-encoder's scores"}


class Engine:
    """Batches the requests of many callers over one exported model.

    Args:
        model: an ``OnnxModel`` (or its folder): a decoder or encoder-decoder for generation,
            an encoder with pooling or a one-label classifier for pooling (``kind`` says which).
        max_batch: generation: most rows decoded together.
        max_queue: most requests waiting; ``submit`` raises :class:`QueueFull` beyond it.
        prefill_tokens: generation: most tokens (rows x longest prompt) prefilled in one run.
        prefix_cache_bytes: generation: most bytes of prompts' caches kept for reuse by prompts
            that start with the same tokens (0: none; see :class:`.PrefixCache`).
        prompt_lookup_num_tokens: generation: drafts (1..64) for requests that set none.
        max_batch_tokens: pooling: most padded tokens in one run of the model.
        batch_size: pooling: most inputs in one run.
        max_wait_s: pooling: how long a call's first request waits for others to join it.
        start: start the loop now (False: call :meth:`start`; tests fill the queue first).
        adapter: generation: the LoRA adapter exported beside the base (``OnnxModel.adapters``)
            every request of this engine decodes with; its rows are batched together. One
            engine per adapter over the same ``OnnxModel`` serves several (its sessions shared).
        max_cache_bytes: generation: most bytes the running batch's key/value cache may come to
            hold (requests wait for room; one that alone needs more is refused); None: a
            quarter of this machine's memory.
    """

    def __init__(self, model: OnnxModel | str, *, max_batch: int = 16, max_queue: int = 64,
                 prefill_tokens: int = 4096, prefix_cache_bytes: int = 0,
                 prompt_lookup_num_tokens: int | None = None,
                 max_batch_tokens: int = DEFAULT_BATCH_TOKENS, batch_size: int = 64,
                 max_wait_s: float = 0.002, start: bool = True, adapter: str | None = None,
                 max_cache_bytes: int | None = None) -> None:
        if min(max_batch, max_queue, prefill_tokens, max_batch_tokens, batch_size) < 1 or min(
                prefix_cache_bytes, max_wait_s) < 0:
            raise InputError(f"max_batch, max_queue, prefill_tokens, max_batch_tokens and batch_size "
                             f"must be at least 1, prefix_cache_bytes and max_wait_s at least 0; got "
                             f"{max_batch}, {max_queue}, {prefill_tokens}, {max_batch_tokens}, "
                             f"{batch_size}, {prefix_cache_bytes} and {max_wait_s}.")
        if max_cache_bytes is not None and (isinstance(max_cache_bytes, bool) or max_cache_bytes < 1):
            raise InputError(f"max_cache_bytes must be at least 1 byte (None: a quarter of this "
                             f"machine's memory), got {max_cache_bytes!r}.")
        self.model = model if isinstance(model, OnnxModel) else OnnxModel(model)
        self.kind: Kind = model_kind(self.model)
        self.max_queue = max_queue
        self.stats = EngineStats()
        self.generation: ContinuousBatch | None = None
        self.pooling: PoolingCalls | None = None
        self.adapter = adapter
        if adapter is not None and self.kind not in DECODING:
            raise InputError(f"adapter={adapter!r}: LoRA adapters serve generation; this model "
                             f"serves {_SERVES[self.kind]}.")
        if self.kind in DECODING:
            self.generation = ContinuousBatch(
                self.model, self.stats, max_batch=max_batch, prefill_tokens=prefill_tokens,
                prefix_cache_bytes=prefix_cache_bytes, prompt_lookup_num_tokens=prompt_lookup_num_tokens,
                adapter=adapter,
                max_cache_bytes=default_cache_bytes() if max_cache_bytes is None else max_cache_bytes)
        else:
            self.pooling = PoolingCalls(self.model, self.kind, self.stats,
                                        max_batch_tokens=max_batch_tokens, batch_size=batch_size,
                                        max_wait_s=max_wait_s)
        self._work = self.generation or self.pooling
        self._waiting = WaitingQueue(max_queue)
        self._ended: list[Request] = []  # ended since the last wake
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        if start:
            self.start()

    # -- the caller's side ------------------------------------------------------------------
    def submit(self, ids: Any, *, stop_matcher: Any = None, timeout: float | None = None,
               prompt_logprobs: int | None = None, source: Any = None, **options: Any) -> GenerationRequest:
        """Queue a prompt (length,) of token ids with generation options (greedy search or
        sampling: ``max_new_tokens``, ``do_sample``, ``temperature``, ``top_p``, ``seed``, ...).
        ``timeout``: most seconds from now to its last token (None: no bound); past it the
        request ends with ``finish_reason`` ``"timeout"`` and the tokens it had.
        ``prompt_logprobs``: report each prompt token's log probability and this many of the
        most likely tokens at its position (``request.prompt_logprobs``; None: no report); with
        ``max_new_tokens=0`` the request ends after that report. A speech model's request (a
        "transcribe" engine) is a window's decoder prompt with its ``source``, the window's
        features (1, channels, 3000) (``OnnxModel.audio_features``); the encoder runs on it once.

        Raises InputError for a bad prompt or option (at once, nothing queued), a
        :class:`~transformer_kit.core.errors.ContextLengthError` (an InputError) for a prompt that
        leaves no room for ``max_new_tokens`` in the model's context, and :class:`QueueFull`
        when ``max_queue`` requests wait already.
        """
        # a speech model's request without its source is refused by its batch, naming the source
        self._check_open("transcribe" if source is not None or self.kind == "transcribe" else "generate",
                         timeout)
        assert self.generation is not None
        return self._queue(self.generation.work(ids, stop_matcher, timeout, options,
                                                prompt_logprobs, source)).request

    def submit_pooling(self, tokens: list[list[int]], extras: list[list[int]], *,
                       timeout: float | None = None) -> PoolingRequest:
        """Queue one request's inputs to embed or score: ``tokens[i]`` a non-empty list of
        ids, ``extras[i]`` as long (pooled positions, or token types); its ``rows`` get (n, dim)
        vectors or (n, num_labels) scores. ``timeout`` as for :meth:`submit`. Raises InputError
        and :class:`QueueFull` as :meth:`submit` does."""
        self._check_open(self.kind if self.kind not in DECODING else "embeddings", timeout)
        return self._queue(PoolingCalls.work(tokens, extras, timeout))

    def _check_open(self, kind: str, timeout: float | None) -> None:
        if self._closed.is_set():
            raise InputError("This engine is closed; make a new one to submit requests.")
        if kind != self.kind and not {kind, self.kind} <= {"embeddings", "rerank"}:
            raise InputError(f"This engine serves {_SERVES[self.kind]} of a "
                             f"{self.model.manifest.architecture} export, not {_SERVES[kind]}.")
        if timeout is not None and not timeout > 0:
            raise InputError(f"timeout must be more than 0 seconds (or None: no bound), got {timeout}.")

    def _queue(self, work: Any) -> Any:
        try:
            self._waiting.put_nowait(work)
        except queue.Full:
            raise QueueFull(f"The queue holds {self.max_queue} requests already (max_queue); "
                            "retry later or start the engine with a larger max_queue.") from None
        return work

    @property
    def queue_length(self) -> int:
        return self._waiting.qsize()

    @property
    def prefix_cache(self) -> Any:
        """The generation side's prefix cache (a :class:`.PrefixCache`), or None."""
        return None if self.generation is None else self.generation.prefix_cache

    @property
    def cache_bytes(self) -> tuple[int, int]:
        """The running batch's key/value cache: (bytes held now, the bound); (0, 0) for a
        pooling engine."""
        if self.generation is None:
            return 0, 0
        return self.generation.decoder.nbytes, self.generation.max_cache_bytes

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=f"transformer-kit-{self.kind}",
                                            daemon=True)
            self._thread.start()

    def run_once(self) -> None:
        """One turn of the loop, by hand, for an engine made with ``start=False``: waiting
        requests admitted (a generation engine: prefilled, one step of the batch; a pooling one:
        one call)."""
        self._turn()

    def close(self, timeout: float = 10.0) -> None:
        """Stop the loop; requests still running or waiting end as cancelled."""
        self._closed.set()
        if self._thread is not None:
            self._thread.join(timeout)
        for request in self._work.running:
            self._finish(request, "cancelled")
        while True:
            try:
                self._finish(_request(self._waiting.get_nowait()), "cancelled")
            except queue.Empty:
                break
        self._wake([])

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the loop ---------------------------------------------------------------------------
    def _finish(self, request: Request, reason: str | None = None, error: str | None = None) -> None:
        if request.done:
            return
        reason = reason or request.finish_reason
        if reason == "timeout" and error is None:
            done = (f"its last token) and was stopped after {len(request.tokens)} new tokens"
                    if isinstance(request, GenerationRequest) else "its answer) and was stopped")
            error = (f"The request ran longer than its limit of {request.timeout:g} s (from its "
                     f"arrival to {done}.")
        request.end(reason, error)
        self.stats.ended(request.finish_reason or "stop")
        self._ended.append(request)

    def _wake(self, requests: list[Request]) -> None:
        """Wake the asyncio readers of ``requests`` and of the requests ended since the last
        wake: one call per event loop, not one per request."""
        events: dict[asyncio.AbstractEventLoop, list[asyncio.Event]] = {}
        for request in [*requests, *self._ended]:
            if request.waker is not None:
                events.setdefault(request.waker[0], []).append(request.waker[1])
        self._ended.clear()
        for loop, todo in events.items():
            with contextlib.suppress(RuntimeError):  # the reader's loop closed: nobody to wake
                loop.call_soon_threadsafe(wake_all, todo)

    def _turn(self) -> None:
        self._wake(self._work.iterate(self._waiting, self._finish))
        if self._waiting.qsize():  # waiting ones that ended before their turn leave now
            for work in self._waiting.take_out(lambda w: _request(w).ending is not None):
                self._finish(_request(work), _request(work).ending)

    def _loop(self) -> None:
        while not self._closed.is_set():
            try:
                self._turn()
            except Exception as exc:  # a failed step ends its requests, not the engine
                message = f"{type(exc).__name__}: {exc}"
                logging.getLogger(__name__).exception("A step failed; its requests end with an error")
                for request in self._work.running:
                    self._finish(request, "error", message)
                self._work.reset()
                self._wake([])
        for request in self._work.running:
            self._finish(request, "cancelled")
        self._wake([])


def _request(work: Any) -> Request:
    """The request of a queued item: a generation row's, or the pooling request itself."""
    return work if isinstance(work, Request) else work.request
