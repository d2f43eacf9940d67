"""A continuous-batching engine: many requests decoded together in one running batch.

Each request is prefilled alone, joins the running batch at the next step boundary, streams its
tokens as they are chosen, and leaves the batch when it ends (an eos id, a stop string,
``max_new_tokens``) or when its caller cancels it. The batch keeps the step graph's layout
(left padding and an attention mask, see :class:`~transformer_kit.export.batch_steps.BatchDecoder`),
so a greedy request gets the tokens ``OnnxModel.generate`` gives it alone (float32; in int4 the
products of a batch run other kernels than those of one row and may round differently), and a
sampled one with a seed the same draws.

One thread runs the loop; ``submit`` may be called from any thread. Queue and batch are bounded.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from transformer_kit.decoding import DecodingState, GenerationConfig, generation_config
from transformer_kit.decoding.prompts import plan
from transformer_kit.decoding.search import sample_rows
from transformer_kit.errors import InputError, TransformerKitError
from transformer_kit.export import OnnxModel
from transformer_kit.export.runtime import check_ids

_END = object()


class QueueFull(TransformerKitError):
    """The engine's queue holds ``max_queue`` requests already; try again later."""


@dataclass
class Request:
    """A submitted request: iterate it for its new tokens (ints) as they are chosen.

    ``finish_reason`` is set when it ends: ``"stop"`` (an eos id or a stop string), ``"length"``
    (max_new_tokens), ``"cancelled"`` or ``"error"`` (then ``error`` says what happened).
    """

    prompt: np.ndarray  # (length,) int64
    options: GenerationConfig
    submitted: float = field(default_factory=time.perf_counter)
    first_token_s: float | None = None
    finish_reason: str | None = None
    error: str | None = None
    tokens: list[int] = field(default_factory=list)
    _stream: queue.SimpleQueue = field(default_factory=queue.SimpleQueue, repr=False)
    _cancelled: threading.Event = field(default_factory=threading.Event, repr=False)
    _row: _Row | None = field(default=None, repr=False)  # set by the engine

    def cancel(self) -> None:
        """Stop decoding this request; its row leaves the batch at the next step boundary."""
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def __iter__(self) -> Iterator[int]:
        while True:
            item = self._stream.get()
            if item is _END:
                return
            yield item

    def result(self) -> list[int]:
        """Every new token, after waiting for the end."""
        for _ in self:
            pass
        return list(self.tokens)


class _Row:
    """The decoding state of one request in the batch: its processors, their history, its
    random generator and its end conditions."""

    def __init__(self, request: Request, pipeline, eos: frozenset[int], stop) -> None:
        self.request, self.pipeline, self.eos, self.stop = request, pipeline, eos, stop
        options = request.options
        self.rng = np.random.default_rng(options.seed) if options.do_sample else None
        self.ids = list(request.prompt.tolist())

    def choose(self, logits: np.ndarray) -> int:
        """The next token from this row's logits (vocab,), as ``stream_tokens`` chooses it."""
        scores = logits[None]
        if len(self.pipeline):
            ids = np.asarray(self.ids, np.int64)[None]
            state = DecodingState(ids, np.ones(ids.shape, bool), len(self.request.prompt))
            scores = self.pipeline(scores.astype(np.float32, copy=True), state)
        token = int(sample_rows(scores, self.rng)[0] if self.rng is not None else scores.argmax())
        self.ids.append(token)
        return token

    def emit(self, token: int) -> bool:
        """Stream ``token``; whether the request ended with it."""
        request = self.request
        if request.first_token_s is None:
            request.first_token_s = time.perf_counter() - request.submitted
        request.tokens.append(token)
        request._stream.put(token)
        new = request.tokens
        if token in self.eos or (self.stop is not None and len(new) >= request.options.min_new_tokens
                                 and bool(self.stop(np.asarray(new, np.int64)[None])[0])):
            request.finish_reason = "stop"
        elif len(new) >= request.options.max_new_tokens:
            request.finish_reason = "length"
        return request.finish_reason is not None


class Engine:
    """Continuous batching over an exported decoder.

    Args:
        model: an ``OnnxModel`` of a decoder (or its folder).
        max_batch: most rows decoded together; further requests wait in the queue.
        max_queue: most requests waiting; ``submit`` raises :class:`QueueFull` beyond it.
        start: start the loop now (False: call :meth:`start`; tests fill the queue first).
    """

    def __init__(self, model: OnnxModel | str, *, max_batch: int = 16, max_queue: int = 64,
                 start: bool = True) -> None:
        if max_batch < 1 or max_queue < 1:
            raise InputError(f"max_batch and max_queue must be at least 1, got {max_batch} and "
                             f"{max_queue}.")
        self.model = model if isinstance(model, OnnxModel) else OnnxModel(model)
        self.batch = self.model.batch_decoder()
        self.max_batch, self.max_queue = max_batch, max_queue
        self._waiting: queue.Queue[Request] = queue.Queue(max_queue)
        self._rows: list[_Row] = []
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        #: Counters for metrics: requests finished by reason, tokens, steps, rows per step.
        self.stats: dict[str, Any] = {"requests": 0, "tokens": 0, "steps": 0, "batch_size": 0,
                                      "max_batch_size": 0, "finished": {}}
        if start:
            self.start()

    # -- the caller's side ------------------------------------------------------------------
    def submit(self, ids: Any, *, stop_matcher=None, **options: Any) -> Request:
        """Queue a prompt (length,) of token ids with generation options (greedy search or
        sampling: ``max_new_tokens``, ``do_sample``, ``temperature``, ``top_p``, ``seed``, ...).

        Raises InputError for a bad prompt or option (at once, nothing queued) and
        :class:`QueueFull` when ``max_queue`` requests wait already.
        """
        if self._closed.is_set():
            raise InputError("This engine is closed; make a new one to submit requests.")
        opts = generation_config(None, **options)
        if opts.num_beams > 1 or opts.num_return_sequences > 1:
            raise InputError("The engine decodes one sequence per request by greedy search or "
                             f"sampling; got num_beams={opts.num_beams}, num_return_sequences="
                             f"{opts.num_return_sequences}. Submit one request per sequence.")
        m = self.model.manifest
        shape = np.shape(ids)
        if len(shape) not in (1, 2) or (len(shape) == 2 and shape[0] != 1) or not np.size(ids):
            raise InputError(f"A request takes one non-empty prompt of token ids, (length,) or "
                             f"(1, length); got shape {tuple(shape)}.")
        prompt = check_ids(np.reshape(ids, (1, -1)), m.src_vocab, "prompt")
        problem, pipeline, _ = plan(prompt, np.ones(prompt.shape, np.int64), opts, decoder=True,
                                    pad_id=m.pad_id, eos_id=m.eos_id, bos_id=m.bos_id,
                                    vocab=m.tgt_vocab, context_length=self.model.context_length,
                                    stop_matcher=stop_matcher)
        request = Request(prompt[0], opts)
        request._row = _Row(request, pipeline, frozenset(problem.eos_ids), problem.stop)
        try:
            self._waiting.put_nowait(request)
        except queue.Full:
            raise QueueFull(f"The queue holds {self.max_queue} requests already (max_queue); "
                            "retry later or start the engine with a larger max_queue.") from None
        return request

    @property
    def queue_length(self) -> int:
        return self._waiting.qsize()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="transformer-kit-engine",
                                            daemon=True)
            self._thread.start()

    def close(self, timeout: float = 10.0) -> None:
        """Stop the loop; requests still running or waiting end as cancelled."""
        self._closed.set()
        if self._thread is not None:
            self._thread.join(timeout)
        while True:
            try:
                self._finish(self._waiting.get_nowait(), "cancelled")
            except queue.Empty:
                break

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the loop ---------------------------------------------------------------------------
    def _finish(self, request: Request, reason: str | None = None, error: str | None = None) -> None:
        if reason is not None:
            request.finish_reason = reason
        request.error = error
        finished = self.stats["finished"]
        finished[request.finish_reason] = finished.get(request.finish_reason, 0) + 1
        self.stats["requests"] += 1
        request._stream.put(_END)

    def _admit(self) -> None:
        """Prefill waiting requests into the batch while it has room (blocks briefly when the
        batch is empty, so an idle engine sleeps)."""
        while len(self._rows) < self.max_batch:
            try:
                request = self._waiting.get(timeout=0.05) if not self._rows else self._waiting.get_nowait()
            except queue.Empty:
                return
            if request.cancelled:
                self._finish(request, "cancelled")
                continue
            row = request._row
            prefilled, logits = self.batch.prefill(request.prompt)
            self.stats["tokens"] += 1
            if row.emit(row.choose(logits)):
                self._finish(request)
                continue
            self.batch.join(prefilled)
            self._rows.append(row)

    def _step(self) -> None:
        gone = [i for i, row in enumerate(self._rows) if row.request.cancelled]
        for i in gone:
            self._finish(self._rows[i].request, "cancelled")
        if gone:
            self._keep([i for i in range(len(self._rows)) if i not in set(gone)])
        if not self._rows:
            return
        tokens = np.array([row.ids[-1] for row in self._rows], np.int64)
        logits = self.batch.step(tokens)
        self.stats["steps"] += 1
        self.stats["batch_size"] = len(self._rows)
        self.stats["max_batch_size"] = max(self.stats["max_batch_size"], len(self._rows))
        self.stats["tokens"] += len(self._rows)
        done = [i for i, row in enumerate(self._rows) if row.emit(row.choose(logits[i]))]
        for i in done:
            self._finish(self._rows[i].request)
        if done:
            self._keep([i for i in range(len(self._rows)) if i not in set(done)])

    def _keep(self, kept: list[int]) -> None:
        self.batch.keep(np.array(kept, np.int64))
        self._rows = [self._rows[i] for i in kept]
        self.stats["batch_size"] = len(self._rows)

    def _loop(self) -> None:
        while not self._closed.is_set():
            try:
                self._admit()
                self._step()
            except Exception as exc:  # a failed step ends the batch's requests, not the engine
                message = f"{type(exc).__name__}: {exc}"
                for row in self._rows:
                    self._finish(row.request, "error", message)
                self._rows = []
                self.batch = self.model.batch_decoder()
        for row in self._rows:
            self._finish(row.request, "cancelled")
        self._rows = []
