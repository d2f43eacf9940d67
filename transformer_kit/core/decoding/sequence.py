"""Greedy search or sampling for one sequence at a time, for callers that run the steps
themselves: a serving engine decodes many requests in one shared batch and asks each request's
search for its next token."""

from __future__ import annotations

import numpy as np

from transformer_kit.core.decoding.logprobs import TokenLogprob, log_softmax, pick
from transformer_kit.core.decoding.options import GenerationConfig
from transformer_kit.core.decoding.processors import Pipeline
from transformer_kit.core.decoding.search import DecodingCall, History, sample_rows, stopped
from transformer_kit.core.decoding.speculative import draft_or_draw


class SequenceSearch:
    """Greedy search or sampling for one sequence whose steps run elsewhere (a serving engine's
    shared batch): the choice and the end ``stream_tokens`` makes for one row, in one home."""

    def __init__(self, call: DecodingCall, options: GenerationConfig, pipeline: Pipeline) -> None:
        self.call, self.options, self.pipeline = call, options, pipeline
        self.rng = np.random.default_rng(options.seed) if options.do_sample else None
        self.eos = frozenset(call.eos_ids)
        self.history = History(call.prompt_ids, call.prompt_real) if len(pipeline) else None
        self.new: list[np.ndarray] = []
        #: The last token's log probability report, with the option ``logprobs`` (else None).
        self.report: TokenLogprob | None = None

    def choose(self, logits: np.ndarray, draft: int | None = None) -> tuple[int, str | None]:
        """The next token from logits (vocab,), which processors may change in place, and why
        the sequence ends with it: "stop" (an eos id, a stop string), "length" or None.
        ``draft``: a token prompt lookup drafted for this position (sampling keeps it with its
        probability, else draws from the rest: speculative sampling, docs/generation.md). With the
        option ``logprobs``, :attr:`report` is the token's log probability report."""
        scores = logits[None]
        top, raw = self.options.logprobs, self.options.logprobs_mode == "raw"
        logprobs = log_softmax(scores) if top is not None and raw else None  # before the processors
        if self.history is not None:
            width = self.call.prompt_ids.shape[1]
            scores = self.pipeline(scores.astype(np.float32, copy=False), self.history.state(width))
        if self.rng is not None and draft is not None:
            token = np.array([draft_or_draw(scores[0], draft, self.rng)], np.int64)
        else:
            token = (sample_rows(scores, self.rng) if self.rng is not None
                     else scores.argmax(axis=-1)).astype(np.int64, copy=False)
        if top is not None:
            self.report = pick(logprobs if raw else log_softmax(scores), token, top)[0]
        if self.history is not None:
            self.history.append(token)
        self.new.append(token)
        ended = stopped(self.call, self.options, token, self.eos, self.new)
        if ended is not None and ended[0]:
            return int(token[0]), "stop"
        return int(token[0]), "length" if len(self.new) >= self.options.max_new_tokens else None
