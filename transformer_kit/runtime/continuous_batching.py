"""Continuous batching of generation requests: many prompts decoded together in one running batch.

Waiting requests are prefilled together, those of one prompt length in one run (all of them,
left-padded, in a :class:`~transformer_kit.runtime.left_padded.LeftPadded` layout), and join the
running batch at a step boundary: the next one its cache layout lets them join at
(``CacheLayout.can_join``: every 16th step in an aligned layout; the first token is streamed
meanwhile). Each streams its tokens as they are chosen and leaves the batch when it ends (an eos
id, a stop string, ``max_new_tokens``) or when its caller cancels it. The batch is the model's
cache layout (:mod:`.cache_layout`), so a greedy request gets the tokens ``OnnxModel.generate``
gives it alone, bit for bit (docs/export.md, "Batch invariance"), and a sampled one with a seed
the same draws.

With a prefix cache (:mod:`.prefix_cache`), a prompt that starts with a cached one's tokens
prefills only the rest; with prompt lookup (:mod:`.speculation`), a request decoding alone
checks drafted tokens in one step.

A speech model's (an encoder-decoder over features) request brings its source, a 30 s window's
features, with its decoder prompt: the encoder runs once per request, and each row carries its
encoder outputs into the batch, so the decoder steps of many transcriptions run together.
"""

from __future__ import annotations

import queue
from collections.abc import Callable
from typing import Any

import numpy as np

from transformer_kit.core.decoding import SequenceSearch, generation_config
from transformer_kit.core.decoding.prompts import decoder_start, prepare_call
from transformer_kit.core.errors import InputError
from transformer_kit.core.speech.transcriber import WINDOW_FRAMES
from transformer_kit.runtime.onnx_model import OnnxModel, check_ids
from transformer_kit.runtime.prefix_cache import PrefixCache, block_keys, next_group
from transformer_kit.runtime.requests import GenerationRequest, Row, WaitingQueue
from transformer_kit.runtime.speculation import default_lookup, drafting_for, speculative_step
from transformer_kit.runtime.stats import EngineStats

#: How the engine ends a request: finish(request, reason (None: its own), error).
Finish = Callable[[Any, "str | None", "str | None"], None]


class ContinuousBatch:
    """The generation side of an engine over an exported decoder.

    Args:
        model: the decoder's ``OnnxModel``.
        stats: the engine's counters.
        max_batch: most rows decoded together; further requests wait.
        prefill_tokens: most tokens (rows x longest prompt) prefilled in one run; waiting
            prompts are prefilled together up to it (a longer prompt runs alone).
        prefix_cache_bytes: most bytes of prompts' caches kept for reuse (0: none).
        prompt_lookup_num_tokens: drafts (1..64) for requests that set none.
        adapter: the LoRA adapter (exported beside the base) every row decodes with; None: the
            base. The prefix cache is this batch's own, so caches never mix adapters.
        max_cache_bytes: most bytes the running batch's cache may come to hold (each row counted
            at its prompt and every token it may add, ``CacheLayout.cache_bytes``): a request
            waits until the rows that would pass it leave, so a row admitted never runs out; one
            that alone would pass it is refused.
    """

    def __init__(self, model: OnnxModel, stats: EngineStats, *, max_batch: int, prefill_tokens: int,
                 prefix_cache_bytes: int, prompt_lookup_num_tokens: int | None,
                 adapter: str | None = None, max_cache_bytes: int) -> None:
        self.model, self.stats, self.adapter = model, stats, adapter
        self.max_batch, self.prefill_tokens, self.max_cache_bytes = max_batch, prefill_tokens, max_cache_bytes
        #: The running batch in the model's cache layout (a new one after a failure).
        self.decoder = model.batch_decoder(adapter)
        #: Whether rows bring a source (features) the encoder runs on at their prefill.
        self.seq2seq = model.manifest.architecture != "decoder"
        # a cached prompt's keys hold its source's cross attention: no reuse across sources
        self.prefix_cache = (PrefixCache(prefix_cache_bytes, self.decoder)
                             if prefix_cache_bytes and not self.seq2seq else None)
        self.prompt_lookup_num_tokens = default_lookup(prompt_lookup_num_tokens, self.decoder)
        self.rows: list[Row] = []
        self.taken: list[Row] = []  # out of the queue by the admission running now
        #: A waiting row taken from the queue whose cache the bound had no room for yet: the
        #: first admitted when rows leave.
        self.held: Row | None = None
        #: Prefilled rows waiting for the batch to reach a length they may join at.
        self.parked: list[tuple[list[Row], Any]] = []

    def work(self, ids: Any, stop_matcher: Any, timeout: float | None, options: dict,
             prompt_logprobs: int | None = None, source: Any = None) -> Row:
        """A prompt (length,) or (1, length) of token ids with its generation options (and how
        many of the most likely tokens to report at each prompt position, None: no report),
        checked and planned: the row to queue. A speech model's prompt is its decoder prompt,
        ``source`` its features (1, channels, frames) (:meth:`source_row`). Raises InputError
        for a bad prompt or option and a ContextLengthError for a prompt that leaves no room
        for ``max_new_tokens``."""
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
        features = self.source_row(source, prompt_logprobs)
        if features is not None:
            prompt = decoder_start(np.reshape(ids, (1, -1)), 1, m.tgt_vocab)
            call, pipeline, _ = prepare_call(
                np.zeros((1, 0), np.int64), None, opts, decoder=False, pad_id=None, eos_id=m.eos_id,
                bos_id=m.bos_id, vocab=m.tgt_vocab, context_length=self.model.context_length,
                stop_matcher=stop_matcher, tokenizer=self.model.tokenizer, decoder_prompt=prompt)
        else:
            prompt = check_ids(np.reshape(ids, (1, -1)), m.src_vocab, "prompt")
            call, pipeline, _ = prepare_call(prompt, np.ones(prompt.shape, np.int64), opts, decoder=True,
                                             pad_id=m.pad_id, eos_id=m.eos_id, bos_id=m.bos_id,
                                             vocab=m.tgt_vocab, context_length=self.model.context_length,
                                             stop_matcher=stop_matcher, tokenizer=self.model.tokenizer)
        if prompt_logprobs is not None:
            self.model.check_prompt_logprobs(prompt.shape[1], prompt_logprobs)
        request = GenerationRequest(prompt=prompt[0], options=opts, timeout=timeout,
                                    prompt_top=prompt_logprobs)
        drafting = drafting_for(opts, call.eos_ids, self.decoder)
        row = Row(request, SequenceSearch(call, opts, pipeline), drafting, features)
        needed = self.decoder.cache_bytes(1, row.columns)
        if needed > self.max_cache_bytes:
            raise InputError(f"This request's cache may take {needed / 2**20:.1f} MiB ({len(row.prompt)} "
                             f"prompt tokens and max_new_tokens {opts.max_new_tokens}), more than the "
                             f"engine's bound of {self.max_cache_bytes / 2**20:.1f} MiB; lower "
                             "max_new_tokens or shorten the prompt, or raise the bound (serve "
                             "--max-cache-bytes).")
        return row

    def source_row(self, source: Any, prompt_logprobs: int | None) -> np.ndarray | None:
        """A speech model's request's source checked: features (1, channels, frames) float32 of
        one 30 s window (the batch's rows share the encoder's length); None for a decoder's,
        which takes none."""
        if not self.seq2seq:
            if source is not None:
                raise InputError("A decoder's request is its prompt alone; give no source.")
            return None
        if source is None:
            raise InputError("A speech model's request needs its source: the features (1, channels, "
                             f"{WINDOW_FRAMES}) of a 30 s window (OnnxModel.audio_features).")
        features = self.model.check_features(source)
        if features.shape[0] != 1 or features.shape[2] != WINDOW_FRAMES:
            raise InputError(f"A request's source is one 30 s window's features, (1, channels, "
                             f"{WINDOW_FRAMES}); got shape {tuple(features.shape)}. Pad or cut the "
                             "audio to 30 s windows (the Transcriber does).")
        if prompt_logprobs is not None:
            raise InputError("prompt_logprobs reports a decoder's prompt; a speech model's request "
                             "takes none.")
        return features

    @property
    def running(self) -> list[Any]:
        """The requests in the batch and those being admitted (a held one among them)."""
        rows = {id(row) for row in self.rows}
        parked = [row for group, _ in self.parked for row in group]
        held = [self.held] if self.held is not None else []
        return [row.request for row in [*self.rows, *parked, *(r for r in self.taken if id(r) not in rows),
                                        *held]]

    def iterate(self, waiting: WaitingQueue, finish: Finish) -> list[Any]:
        """Admit waiting requests, then one step of the batch; the requests to wake."""
        admitted = self.admit(waiting, finish)
        self._join_parked(finish)
        self.step(waiting, finish)
        return [row.request for row in [*admitted, *self.rows]]

    def admit(self, waiting: WaitingQueue, finish: Finish) -> list[Row]:
        """Prefill waiting requests into the batch while it has room, several in one run of the
        step graph (at most ``prefill_tokens`` padded tokens each); the rows admitted. Blocks
        briefly when the batch is empty, so an idle engine sleeps."""
        rows = self._take(waiting, finish)
        rows.sort(key=lambda r: len(r.prompt))  # similar lengths together: little padding
        self.taken = list(rows)
        cache = self.prefix_cache
        keys = {id(r): block_keys(r.prompt) if cache is not None else [] for r in rows}
        admitted: list[Row] = []
        same_length = not self.decoder.pads_prompts
        while rows:
            group, hit = next_group(rows, self.prefill_tokens, cache, keys, same_length)
            admitted.extend(group)
            self._prefill(group, hit, finish)
        self.taken = []
        return admitted

    def _take(self, waiting: WaitingQueue, finish: Finish) -> list[Row]:
        """The waiting rows the batch has room for, in rows and in the cache's bound (those
        that ended while waiting end now)."""
        rows: list[Row] = []
        parked = [row for group, _ in self.parked for row in group]
        while len(self.rows) + len(parked) + len(rows) < self.max_batch:
            row, self.held = self.held, None
            if row is None:
                try:
                    wait = not self.rows and not rows and not parked
                    row = waiting.get(timeout=0.05) if wait else waiting.get_nowait()
                except queue.Empty:
                    break
            if row.request.ending is not None:
                finish(row.request, row.request.ending, None)
                continue
            admitted = [*self.rows, *parked, *rows, row]
            columns = max(r.columns for r in admitted)
            if self.decoder.cache_bytes(len(admitted), columns) > self.max_cache_bytes:
                self.held = row
                break
            self.decoder.columns_bound = columns
            rows.append(row)
        return rows

    def _prefill(self, group: list[Row], hit: Any, finish: Finish) -> None:
        """Prefill ``group`` in one run (after the cached prefix ``hit``, if any); its first
        tokens chosen, the rows that go on joining the batch."""
        group = self._report_prompts(group, finish)
        if not group:
            return
        cache = self.prefix_cache
        skip = 0 if hit is None else hit.tokens
        past = None if hit is None else cache.past(hit, len(group))
        prompts = [r.prompt[skip:] for r in group]
        if self.seq2seq:
            prefilled, logits = self.decoder.prefill(prompts, fixed=self._encoded(group))
        else:
            prefilled, logits = self.decoder.prefill(prompts, past, skip)
        self.stats.generated_tokens += len(group)
        self.stats.prefills += 1
        keep = []
        for i, row in enumerate(group):
            if cache is not None:
                row.request.cached_tokens = cache.use(hit)
            if row.advance(logits[i]):
                finish(row.request, None, None)
            else:
                keep.append(i)
            if cache is not None:  # after its first token: a copy of its columns, if padded
                cache.store(row.prompt, prefilled, i)
        if keep:
            if len(keep) < len(group):
                prefilled = self.decoder.select(prefilled, np.array(keep, np.int64))
            self.parked.append(([group[i] for i in keep], prefilled))
            self._join_parked(finish)

    def _encoded(self, group: list[Row]) -> list[Any]:
        """The encoder's outputs for the rows' sources, rows first (their sources then dropped)."""
        # one row a run: windows batched run no faster (their attention is the work) and hold
        # every window's attention scores at once
        fixed = self.model.encode_source(group[0].source)
        for row in group[1:]:
            fixed = self.decoder.cache_ops.concat(fixed, self.model.encode_source(row.source))
        self.stats.encoded += len(group)
        for row in group:
            row.source = None  # its encoder outputs are in the batch now
        return fixed

    def _report_prompts(self, group: list[Row], finish: Finish) -> list[Row]:
        """The prompt reports of the rows that asked for them (``prompt_logprobs``), from the
        model's logits over the whole prompt; those that generate nothing (``max_new_tokens``
        0) end here. The rows left to prefill."""
        rest = []
        for row in group:
            request = row.request
            if request.prompt_top is not None:
                request.prompt_logprobs = self.model.prompt_logprobs(row.prompt, request.prompt_top,
                                                                     adapter=self.adapter)
            if request.options.max_new_tokens == 0:
                finish(request, "length", None)
            else:
                rest.append(row)
        return rest

    def _join_parked(self, finish: Finish) -> None:
        """Prefilled rows join the batch if it may take them now (those that ended while
        parked end instead)."""
        while self.parked and self.decoder.can_join:
            group, prefilled = self.parked.pop(0)
            gone = [i for i, row in enumerate(group) if row.request.ending is not None]
            for i in gone:
                finish(group[i].request, group[i].request.ending, None)
            if gone:
                keep = [i for i in range(len(group)) if i not in gone]
                if not keep:
                    continue
                prefilled = self.decoder.select(prefilled, np.array(keep, np.int64))
                group = [group[i] for i in keep]
            self.decoder.join(prefilled)
            self.rows.extend(group)

    def step(self, waiting: WaitingQueue, finish: Finish) -> None:
        """End the rows that must end (cancelled, past their time), then one step of the rest
        (a speculative one when a lone row drafts)."""
        gone = {i: row.request.ending for i, row in enumerate(self.rows)
                if row.request.ending is not None}
        for i, reason in gone.items():
            finish(self.rows[i].request, reason, None)
        if gone:
            self.keep([i for i in range(len(self.rows)) if i not in gone])
        if not self.rows or self._speculative_step(waiting, finish):
            return
        tokens = np.array([row.last for row in self.rows], np.int64)
        logits = self.decoder.step(tokens)
        self.stats.steps += 1
        self.stats.batched(len(self.rows))
        self.stats.generated_tokens += len(self.rows)
        done = [i for i, row in enumerate(self.rows) if row.advance(logits[i])]
        for i in done:
            finish(self.rows[i].request, None, None)
        if done:
            self.keep([i for i in range(len(self.rows)) if i not in set(done)])

    def _speculative_step(self, waiting: WaitingQueue, finish: Finish) -> bool:
        """A step checking prompt lookup's drafts, when the batch's only row asked for them and
        nobody waits (:mod:`.speculation`); whether it ran."""
        row = self.rows[0] if len(self.rows) == 1 and not waiting.qsize() and not self.parked else None
        drafts = row.drafting.draft(row) if row is not None and row.drafting is not None else None
        if drafts is None or not len(drafts):
            return False
        if speculative_step(self.decoder, row, drafts, self.stats):
            finish(row.request, None, None)
            self.keep([])
        return True

    def keep(self, kept: list[int]) -> None:
        """Keep only rows ``kept`` of the batch."""
        self.decoder.keep(np.array(kept, np.int64))
        self.rows = [self.rows[i] for i in kept]
        self.stats.batch_size = len(self.rows)

    def reset(self) -> None:
        """After a failed step (the engine ended every :attr:`running` request): no rows, a new batch."""
        self.rows, self.taken, self.parked, self.held = [], [], [], None
        self.decoder = self.model.batch_decoder(self.adapter)
        if self.prefix_cache is not None:
            self.prefix_cache.layout = self.decoder
        self.stats.batch_size = 0
