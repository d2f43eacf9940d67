"""A continuous-batching engine: many requests decoded together in one running batch.

Waiting requests are prefilled together (left-padded) and join the running batch at the next
step boundary in one copy; each streams its tokens as they are chosen and leaves the batch when
it ends (an eos id, a stop string, ``max_new_tokens``) or when its caller cancels it. The batch
keeps the step graph's layout (left padding and an attention mask: ``BatchDecoder``), so a greedy
request gets the tokens ``OnnxModel.generate`` gives it alone (float32; int4 batches run other
kernels, which may round differently), and a sampled one with a seed the same draws.

One thread runs the loop; ``submit`` may be called from any thread. Queue and batch are bounded,
and so, when it is submitted with a ``timeout``, is a request's time: past it the request ends
(``"timeout"``) at the next step boundary, waiting or running, and its row leaves the batch.
Asynchronous readers (:meth:`Request.arrivals`) are woken once per step per event loop.

With ``prefix_cache_bytes``, prompts' caches are kept (:mod:`.prefix_cache`): a prompt that starts
with a cached one's tokens prefills only the rest. A failed step is logged with its traceback."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
from typing import Any

import numpy as np

from transformer_kit.apps.serving.prefix_cache import PrefixCache, block_keys, next_group
from transformer_kit.apps.serving.requests import END, Request, Row, WaitingQueue, wake_all
from transformer_kit.apps.serving.speculation import default_lookup, drafting_for, speculative_step
from transformer_kit.decoding import SequenceSearch, generation_config
from transformer_kit.decoding.prompts import plan
from transformer_kit.errors import InputError, TransformerKitError
from transformer_kit.export import OnnxModel
from transformer_kit.export.runtime import check_ids


class QueueFull(TransformerKitError):
    """The engine's queue holds ``max_queue`` requests already; try again later."""


def _ending(request: Request) -> str | None:
    """Why a request ends before its last token: past its time, or cancelled (None: neither)."""
    if request.expired:
        return "timeout"
    return "cancelled" if request.cancelled else None


class Engine:
    """Continuous batching over an exported decoder.

    Args:
        model: an ``OnnxModel`` of a decoder (or its folder).
        max_batch: most rows decoded together; further requests wait in the queue.
        max_queue: most requests waiting; ``submit`` raises :class:`QueueFull` beyond it.
        prefill_tokens: most tokens (rows x longest prompt) prefilled in one run; waiting
            prompts are prefilled together up to it (a longer prompt runs alone).
        prefix_cache_bytes: most bytes of prompts' caches kept for reuse by prompts that start
            with the same tokens (0: none; see :class:`.PrefixCache`).
        prompt_lookup_num_tokens: drafts (1..64) for requests that set none (:mod:`.speculation`).
        start: start the loop now (False: call :meth:`start`; tests fill the queue first).
    """

    def __init__(self, model: OnnxModel | str, *, max_batch: int = 16, max_queue: int = 64,
                 prefill_tokens: int = 4096, prefix_cache_bytes: int = 0,
                 prompt_lookup_num_tokens: int | None = None, start: bool = True) -> None:
        if min(max_batch, max_queue, prefill_tokens) < 1 or prefix_cache_bytes < 0:
            raise InputError(f"max_batch, max_queue and prefill_tokens must be at least 1 and "
                             f"prefix_cache_bytes at least 0, got {max_batch}, {max_queue}, "
                             f"{prefill_tokens} and {prefix_cache_bytes}.")
        self.model = model if isinstance(model, OnnxModel) else OnnxModel(model)
        self.batch = self.model.batch_decoder()
        self.prefix_cache = (PrefixCache(prefix_cache_bytes, self.batch.cache_ops)
                             if prefix_cache_bytes else None)
        self.prompt_lookup_num_tokens = default_lookup(prompt_lookup_num_tokens, self.batch)
        self.max_batch, self.max_queue, self.prefill_tokens = max_batch, max_queue, prefill_tokens
        self._waiting: WaitingQueue = WaitingQueue(max_queue)
        self._rows: list[Row] = []
        self._taken: list[Request] = []  # out of the queue by the admission running now
        self._ended: list[Request] = []  # finished since the last wake
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        #: Counters for metrics: requests finished by reason, tokens, steps, prefill runs, rows.
        self.stats: dict[str, Any] = {"requests": 0, "tokens": 0, "steps": 0, "prefills": 0,
                                      "batch_size": 0, "max_batch_size": 0, "finished": {},
                                      "drafted_tokens": 0, "accepted_tokens": 0}
        if start:
            self.start()

    # -- the caller's side ------------------------------------------------------------------
    def submit(self, ids: Any, *, stop_matcher=None, timeout: float | None = None,
               **options: Any) -> Request:
        """Queue a prompt (length,) of token ids with generation options (greedy search or
        sampling: ``max_new_tokens``, ``do_sample``, ``temperature``, ``top_p``, ``seed``, ...).
        ``timeout``: most seconds from now to its last token (None: no bound); past it the
        request ends with ``finish_reason`` ``"timeout"`` and the tokens it had.

        Raises InputError for a bad prompt or option (at once, nothing queued), a
        :class:`~transformer_kit.errors.ContextLengthError` (an InputError) for a prompt that
        leaves no room for ``max_new_tokens`` in the model's context, and :class:`QueueFull`
        when ``max_queue`` requests wait already.
        """
        if self._closed.is_set():
            raise InputError("This engine is closed; make a new one to submit requests.")
        if timeout is not None and not timeout > 0:
            raise InputError(f"timeout must be more than 0 seconds (or None: no bound), got {timeout}.")
        if options.get("prompt_lookup_num_tokens") is None:  # the engine's default, if any
            options["prompt_lookup_num_tokens"] = self.prompt_lookup_num_tokens
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
                                    stop_matcher=stop_matcher, tokenizer=self.model.tokenizer)
        request = Request(prompt[0], opts, timeout)
        request._row = Row(request, SequenceSearch(problem, opts, pipeline),
                           drafting_for(opts, problem.eos_ids, self.batch))
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
        self._wake([])

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the loop ---------------------------------------------------------------------------
    def _finish(self, request: Request, reason: str | None = None, error: str | None = None) -> None:
        if reason is not None:
            request.finish_reason = reason
        if reason == "timeout" and error is None:
            error = (f"The request ran longer than its limit of {request.timeout:g} s (from its "
                     f"arrival to its last token) and was stopped after {len(request.tokens)} new "
                     "tokens.")
        request.error = error
        finished = self.stats["finished"]
        finished[request.finish_reason] = finished.get(request.finish_reason, 0) + 1
        self.stats["requests"] += 1
        request._stream.put(END)
        self._ended.append(request)

    def _wake(self, rows: list[Row]) -> None:
        """Wake the asyncio readers of ``rows`` and of the requests ended since the last wake:
        one call per event loop, not one per token."""
        events: dict[asyncio.AbstractEventLoop, list[asyncio.Event]] = {}
        for request in [*(row.request for row in rows), *self._ended]:
            if request._waker is not None:
                events.setdefault(request._waker[0], []).append(request._waker[1])
        self._ended.clear()
        for loop, todo in events.items():
            with contextlib.suppress(RuntimeError):  # the reader's loop closed: nobody to wake
                loop.call_soon_threadsafe(wake_all, todo)

    def _admit(self) -> list[Row]:
        """Prefill waiting requests into the batch while it has room, several in one run of the
        step graph (at most ``prefill_tokens`` padded tokens each); the rows admitted. Blocks
        briefly when the batch is empty, so an idle engine sleeps."""
        waiting: list[Request] = []
        while len(self._rows) + len(waiting) < self.max_batch:
            try:
                wait = not self._rows and not waiting
                request = self._waiting.get(timeout=0.05) if wait else self._waiting.get_nowait()
            except queue.Empty:
                break
            reason = _ending(request)
            if reason is not None:
                self._finish(request, reason)
            else:
                waiting.append(request)
        admitted: list[Row] = []
        waiting.sort(key=lambda r: len(r.prompt))  # similar lengths together: little padding
        self._taken = list(waiting)
        cache = self.prefix_cache
        keys = {id(r): block_keys(r.prompt) if cache is not None else [] for r in waiting}
        while waiting:
            group, hit = next_group(waiting, self.prefill_tokens, cache, keys)
            skip = 0 if hit is None else hit.tokens
            past = None if hit is None else cache.past(hit, len(group))
            prefilled, logits = self.batch.prefill([r.prompt[skip:] for r in group], past, skip)
            self.stats["tokens"] += len(group)
            self.stats["prefills"] += 1
            keep = []
            for i, request in enumerate(group):
                row = request._row
                admitted.append(row)
                if cache is not None:
                    request.cached_tokens = cache.use(hit)
                if row.advance(logits[i]):
                    self._finish(request)
                else:
                    keep.append(i)
                if cache is not None:  # after its first token: a copy of its columns, if padded
                    cache.store(request.prompt, prefilled, i)
            if keep:
                if len(keep) < len(group):
                    prefilled = self.batch.select(prefilled, np.array(keep, np.int64))
                self.batch.join(prefilled)
                self._rows.extend(group[i]._row for i in keep)
        self._taken = []
        return admitted

    def _step(self) -> None:
        ending = [(i, _ending(row.request)) for i, row in enumerate(self._rows)]
        gone = [i for i, reason in ending if reason is not None]
        for i in gone:
            self._finish(self._rows[i].request, ending[i][1])
        if gone:
            self._keep([i for i in range(len(self._rows)) if i not in set(gone)])
        if not self._rows:
            return
        if self._speculative_step():
            return
        tokens = np.array([row.last for row in self._rows], np.int64)
        logits = self.batch.step(tokens)
        self.stats["steps"] += 1
        self.stats["batch_size"] = len(self._rows)
        self.stats["max_batch_size"] = max(self.stats["max_batch_size"], len(self._rows))
        self.stats["tokens"] += len(self._rows)
        done = [i for i, row in enumerate(self._rows) if row.advance(logits[i])]
        for i in done:
            self._finish(self._rows[i].request)
        if done:
            self._keep([i for i in range(len(self._rows)) if i not in set(done)])

    def _speculative_step(self) -> bool:
        """A step checking prompt lookup's drafts, when the batch's only row asked for them and
        nobody waits (:mod:`.speculation`); whether it ran."""
        row = self._rows[0] if len(self._rows) == 1 and not self._waiting.qsize() else None
        drafts = row.drafting.draft(row) if row is not None and row.drafting is not None else None
        if drafts is None or not len(drafts):
            return False
        if speculative_step(self.batch, row, drafts, self.stats):
            self._finish(row.request)
            self._keep([])
        return True

    def _keep(self, kept: list[int]) -> None:
        self.batch.keep(np.array(kept, np.int64))
        self._rows = [self._rows[i] for i in kept]
        self.stats["batch_size"] = len(self._rows)

    def _loop(self) -> None:
        while not self._closed.is_set():
            try:
                self._wake(self._admit())
                self._step()
                if self._waiting.qsize():  # waiting ones that ended before their turn leave now
                    for request in self._waiting.take_out(lambda r: _ending(r) is not None):
                        self._finish(request, _ending(request))
                self._wake(self._rows)
            except Exception as exc:  # a failed step ends the batch's requests, not the engine
                message = f"{type(exc).__name__}: {exc}"
                logging.getLogger(__name__).exception("A step failed; its requests end with an error")
                rows = {id(row) for row in self._rows}  # and those out of the queue, not yet in
                stranded = [r for r in self._taken if r.finish_reason is None and id(r._row) not in rows]
                for request in [*(row.request for row in self._rows), *stranded]:
                    self._finish(request, "error", message)
                self._rows, self._taken = [], []
                self.batch = self.model.batch_decoder()
                self._wake([])
        for row in self._rows:
            self._finish(row.request, "cancelled")
        self._rows = []
        self._wake([])
