"""Pooling requests of an embedding model or a cross-encoder, batched across callers: the
requests of many callers run together, cut into runs by a token budget.

A request is its inputs' token ids (and per token a second row: the pooled positions of an
embedding input, the token types of a (query, document) pair). The engine's loop takes the
first waiting request, then gathers the requests that arrive within ``max_wait_s`` (or until
``max_batch_tokens`` real tokens are gathered), runs all their inputs in one call
(:func:`~transformer_kit.core.embedding.plan_batches`, longest first, each run at most
``batch_size`` rows and ``max_batch_tokens`` padded tokens, through the model's
``run_embedding`` or ``run_scores``) and hands each request its own rows. While a call runs,
new requests wait and go together into the next one.
"""

from __future__ import annotations

import queue
import time
from typing import Any, Literal

import numpy as np

from transformer_kit.core.embedding import plan_batches
from transformer_kit.core.errors import InputError
from transformer_kit.runtime.onnx_model import OnnxModel
from transformer_kit.runtime.requests import PoolingRequest, WaitingQueue
from transformer_kit.runtime.stats import EngineStats

#: What an engine serves: text generation, speech to text, sentence embeddings, or a
#: cross-encoder's scores.
Kind = Literal["generate", "transcribe", "embeddings", "rerank"]


def model_kind(model: OnnxModel) -> Kind:
    """What an export serves: "generate" (a decoder or an encoder-decoder of text),
    "transcribe" (a speech model: an encoder-decoder over features with speech settings),
    "embeddings" (an encoder with pooling: a sentence-embedding model), "rerank" (an encoder
    with a one-label classifier: a cross-encoder); InputError with a sentence for an encoder
    with neither."""
    m = model.manifest
    if m.architecture != "encoder":
        return "transcribe" if model.takes_features and m.config.get("speech") else "generate"
    if m.config.get("pooling"):
        return "embeddings"
    classifier = m.config.get("classifier")
    if classifier:
        if classifier.get("num_labels", 1) != 1:
            raise InputError(f"This cross-encoder's classifier has {classifier['num_labels']} labels; "
                             "reranking ranks by one relevance score, so serve a one-label "
                             "cross-encoder (or call OnnxModel.score for every label).")
        return "rerank"
    raise InputError("This encoder export has neither pooling (a sentence-embedding model, served "
                     "on /v1/embeddings) nor a classifier (a cross-encoder, served on /v1/rerank); "
                     "export a sentence-transformers folder or a *ForSequenceClassification "
                     "checkpoint to serve it.")


class PoolingCalls:
    """The pooling side of an engine over an embedding model or a cross-encoder.

    Args:
        model: the ``OnnxModel``, with pooling or a one-label classifier (``kind`` says which).
        stats: the engine's counters.
        max_batch_tokens: most padded tokens (rows x longest) in one run of the model, and the
            real tokens gathered for one call (a larger request runs alone).
        batch_size: most rows (inputs) in one run.
        max_wait_s: how long the first request of a call waits for others to join it.
    """

    def __init__(self, model: OnnxModel, kind: Kind, stats: EngineStats, *, max_batch_tokens: int,
                 batch_size: int, max_wait_s: float) -> None:
        self.model, self.kind, self.stats = model, kind, stats
        self.max_batch_tokens, self.batch_size, self.max_wait_s = max_batch_tokens, batch_size, max_wait_s
        self.pad_id = model.manifest.pad_id or 0
        self.held: PoolingRequest | None = None  # out of the queue but over the call's budget: next
        self.taken: list[PoolingRequest] = []  # the call running now

    @staticmethod
    def work(tokens: list[list[int]], extras: list[list[int]], timeout: float | None) -> PoolingRequest:
        """One request's inputs (each a non-empty list of ids, ``extras`` as long), checked."""
        if not tokens or len(tokens) != len(extras) or any(
                not t or len(t) != len(e) for t, e in zip(tokens, extras, strict=True)):
            raise InputError(f"A request takes one or more non-empty id lists, each with an extra "
                             f"row as long; got {len(tokens)} inputs and {len(extras)} extra rows.")
        return PoolingRequest(tokens=tokens, extras=extras, timeout=timeout)

    @property
    def running(self) -> list[Any]:
        """The requests of the call running now and the one held for the next."""
        return [*self.taken, *([self.held] if self.held is not None else [])]

    def iterate(self, waiting: WaitingQueue, finish: Any) -> list[Any]:
        """Gather the next call's requests and run it; the requests to wake."""
        requests = self._gather(waiting, finish)
        if requests:
            self.taken = requests
            self._call(requests, finish)
            self.taken = []
        return requests

    def _gather(self, waiting: WaitingQueue, finish: Any) -> list[PoolingRequest]:
        """The requests of the next call: the first waiting one, then those arriving within
        ``max_wait_s`` while the gathered real tokens stay within ``max_batch_tokens``; those
        that ended while waiting (cancelled, past their time) end now instead."""
        gathered: list[PoolingRequest] = []
        tokens, deadline = 0, None
        while tokens < self.max_batch_tokens:
            request, self.held = self.held, None
            try:
                if request is None:
                    left = 0.05 if deadline is None else max(deadline - time.monotonic(), 0)
                    request = waiting.get(timeout=left)
            except queue.Empty:
                break
            if request.ending is not None:
                finish(request, request.ending, None)
                continue
            if gathered and tokens + request.token_count > self.max_batch_tokens:
                self.held = request  # first of the next call
                break
            gathered.append(request)
            tokens += request.token_count
            deadline = deadline or time.monotonic() + self.max_wait_s
        return gathered

    def _call(self, requests: list[PoolingRequest], finish: Any) -> None:
        """All inputs of ``requests`` in one call (runs by token budget), each its own rows."""
        tokens = [t for request in requests for t in request.tokens]
        extras = [e for request in requests for e in request.extras]
        run = self.model.run_embedding if self.kind == "embeddings" else self.model.run_scores
        out: np.ndarray | None = None
        for batch in plan_batches(tokens, extras, batch_size=self.batch_size,
                                  max_batch_tokens=self.max_batch_tokens, pad_id=self.pad_id):
            rows = np.asarray(run(batch.ids, batch.real, batch.extra), np.float32)
            if out is None:
                out = np.empty((len(tokens), rows.shape[1]), np.float32)
            out[batch.rows] = rows
            self.stats.runs += 1
        assert out is not None  # every request holds one input at least
        stats = self.stats  # counted before the answers go out: a caller that got one sees its call
        stats.calls += 1
        stats.inputs += len(tokens)
        stats.input_tokens += sum(map(len, tokens))
        stats.batched(len(requests))
        start = 0
        for request in requests:
            request.rows = out[start:start + len(request.tokens)]
            finish(request, "stop", None)
            start += len(request.tokens)

    def reset(self) -> None:
        """After a failed call: nothing running."""
        self.taken = []
