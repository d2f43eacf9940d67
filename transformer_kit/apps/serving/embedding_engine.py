"""Batching across clients for an embedding model or a cross-encoder: requests from many
clients run together, cut into runs by a token budget.

A request is its inputs' token ids (and per token a second row: the pooled positions of an
embedding input, the token types of a (query, document) pair). One worker thread takes the
first waiting request, then gathers the requests that arrive within ``max_wait_s`` (or until
``max_batch_tokens`` real tokens are gathered), runs all their inputs in one call
(:func:`~transformer_kit.embedding.plan_batches`, longest first, each run at most
``batch_size`` rows and ``max_batch_tokens`` padded tokens, through the model's
``run_embedding`` or ``run_scores``) and hands each request its own rows. While a call runs,
new requests wait and go together into the next one.
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future
from typing import Literal

import numpy as np

from transformer_kit.apps.serving.engine import QueueFull
from transformer_kit.embedding import plan_batches
from transformer_kit.embedding.api import DEFAULT_BATCH_TOKENS
from transformer_kit.errors import InputError
from transformer_kit.export import OnnxModel

Kind = Literal["embeddings", "rerank"]


def model_kind(model: OnnxModel) -> Kind:
    """What an export serves: "embeddings" with pooling (a sentence-embedding model), "rerank"
    with a one-label classifier (a cross-encoder); InputError with a sentence otherwise."""
    m = model.manifest
    if m.architecture == "encoder" and m.config.get("pooling"):
        return "embeddings"
    classifier = m.config.get("classifier") if m.architecture == "encoder" else None
    if classifier:
        if classifier.get("num_labels", 1) != 1:
            raise InputError(f"This cross-encoder's classifier has {classifier['num_labels']} labels; "
                             "/v1/rerank ranks by one relevance score, so serve a one-label "
                             "cross-encoder (or call OnnxModel.score for every label).")
        return "rerank"
    raise InputError(f"This {m.architecture} export has neither pooling (a sentence-embedding model, "
                     "served on /v1/embeddings) nor a classifier (a cross-encoder, served on "
                     "/v1/rerank); export a sentence-transformers folder or a "
                     "*ForSequenceClassification checkpoint to serve it.")


class Job:
    """One request's inputs: ``tokens[i]`` the ids of input i, ``extras[i]`` as long (pooled
    positions or token types); ``future`` gets its rows, (n, dim) or (n, num_labels) float32."""

    def __init__(self, tokens: list[list[int]], extras: list[list[int]]) -> None:
        self.tokens, self.extras = tokens, extras
        self.future: Future[np.ndarray] = Future()

    @property
    def token_count(self) -> int:
        return sum(map(len, self.tokens))


class EmbeddingEngine:
    """Runs the requests of many clients together over an exported embedding model or
    cross-encoder (``kind`` says which; see :func:`model_kind`).

    Args:
        model: an ``OnnxModel`` (or its folder) with pooling or a one-label classifier.
        max_queue: most requests waiting; :meth:`submit` raises :class:`QueueFull` beyond it.
        max_batch_tokens: most padded tokens (rows x longest) in one run of the model, and the
            real tokens gathered for one call (a larger request runs alone).
        batch_size: most rows (inputs) in one run.
        max_wait_s: how long the first request of a call waits for others to join it.
        start: start the worker now (False: call :meth:`start`; tests fill the queue first).
    """

    def __init__(self, model: OnnxModel | str, *, max_queue: int = 64,
                 max_batch_tokens: int = DEFAULT_BATCH_TOKENS, batch_size: int = 64,
                 max_wait_s: float = 0.002, start: bool = True) -> None:
        if min(max_queue, max_batch_tokens, batch_size) < 1 or max_wait_s < 0:
            raise InputError(f"max_queue, max_batch_tokens and batch_size must be at least 1 and "
                             f"max_wait_s at least 0; got {max_queue}, {max_batch_tokens}, "
                             f"{batch_size} and {max_wait_s}.")
        self.model = model if isinstance(model, OnnxModel) else OnnxModel(model)
        self.kind: Kind = model_kind(self.model)
        self.max_queue, self.max_batch_tokens = max_queue, max_batch_tokens
        self.batch_size, self.max_wait_s = batch_size, max_wait_s
        self._run = self.model.run_embedding if self.kind == "embeddings" else self.model.run_scores
        self._pad_id = self.model.manifest.pad_id or 0
        self._waiting: queue.Queue[Job] = queue.Queue(max_queue)
        self._held: Job | None = None  # taken from the queue but over the call's budget: next call
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        #: Counters: calls, runs of the model, requests and inputs served; batch_size = requests
        #: in the last call, max_batch_size = most requests in one call (> 1: batched across clients).
        self.stats: dict[str, int] = {"calls": 0, "runs": 0, "requests": 0, "inputs": 0, "tokens": 0,
                                      "batch_size": 0, "max_batch_size": 0}
        if start:
            self.start()

    # -- the caller's side ------------------------------------------------------------------
    def submit(self, tokens: list[list[int]], extras: list[list[int]]) -> Job:
        """Queue one request's inputs (each a non-empty list of ids, ``extras`` as long); its
        ``future`` gets (n, dim) vectors or (n, num_labels) scores. Raises QueueFull when
        ``max_queue`` requests wait already."""
        if self._closed.is_set():
            raise InputError("This engine is closed; make a new one to submit requests.")
        if not tokens or len(tokens) != len(extras) or any(
                not t or len(t) != len(e) for t, e in zip(tokens, extras, strict=True)):
            raise InputError(f"A request takes one or more non-empty id lists, each with an extra "
                             f"row as long; got {len(tokens)} inputs and {len(extras)} extra rows.")
        job = Job(tokens, extras)
        try:
            self._waiting.put_nowait(job)
        except queue.Full:
            raise QueueFull(f"The queue holds {self.max_queue} requests already (max_queue); "
                            "retry later or start the server with a larger max_queue.") from None
        return job

    @property
    def queue_length(self) -> int:
        return self._waiting.qsize()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="transformer-kit-embeddings",
                                            daemon=True)
            self._thread.start()

    def close(self, timeout: float = 10.0) -> None:
        """Stop the worker; requests still waiting fail with an InputError."""
        self._closed.set()
        if self._thread is not None:
            self._thread.join(timeout)
        left = [self._held] if self._held else []
        while True:
            try:
                left.append(self._waiting.get_nowait())
            except queue.Empty:
                break
        for job in left:
            job.future.set_exception(InputError("The server closed before this request ran; send it "
                                                "again."))

    def __enter__(self) -> EmbeddingEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the worker ------------------------------------------------------------------------
    def _gather(self) -> list[Job]:
        """The requests of the next call: the first waiting one, then those arriving within
        ``max_wait_s`` while the gathered real tokens stay within ``max_batch_tokens``."""
        first = self._held
        self._held = None
        if first is None:
            try:
                first = self._waiting.get(timeout=0.05)
            except queue.Empty:
                return []
        jobs, tokens = [first], first.token_count
        deadline = time.monotonic() + self.max_wait_s
        while tokens < self.max_batch_tokens:
            try:
                job = self._waiting.get(timeout=max(deadline - time.monotonic(), 0))
            except queue.Empty:
                break
            if tokens + job.token_count > self.max_batch_tokens:
                self._held = job  # first of the next call
                break
            jobs.append(job)
            tokens += job.token_count
        return jobs

    def _call(self, jobs: list[Job]) -> None:
        """All inputs of ``jobs`` in one call (runs by token budget), each job its own rows."""
        tokens = [t for job in jobs for t in job.tokens]
        extras = [e for job in jobs for e in job.extras]
        out: np.ndarray | None = None
        for batch in plan_batches(tokens, extras, batch_size=self.batch_size,
                                  max_batch_tokens=self.max_batch_tokens, pad_id=self._pad_id):
            rows = np.asarray(self._run(batch.ids, batch.keep, batch.extra), np.float32)
            if out is None:
                out = np.empty((len(tokens), rows.shape[1]), np.float32)
            out[batch.rows] = rows
            self.stats["runs"] += 1
        assert out is not None  # every job holds one input at least
        stats = self.stats  # counted before the answers go out: a caller that got one sees its call
        stats["calls"] += 1
        stats["requests"] += len(jobs)
        stats["inputs"] += len(tokens)
        stats["tokens"] += sum(map(len, tokens))
        stats["batch_size"] = len(jobs)
        stats["max_batch_size"] = max(stats["max_batch_size"], len(jobs))
        start = 0
        for job in jobs:
            job.future.set_result(out[start:start + len(job.tokens)])
            start += len(job.tokens)

    def _loop(self) -> None:
        while not self._closed.is_set():
            jobs = self._gather()
            if not jobs:
                continue
            try:
                self._call(jobs)
            except Exception as exc:  # a failed call fails its requests, not the worker
                for job in jobs:
                    if not job.future.done():
                        job.future.set_exception(exc)

