"""The decoding strategies, written once on numpy next-token logits for every runtime.

A runtime (PyTorch model, onnxruntime graphs) implements :class:`Stepper`: it runs the prompt,
then one token per row at a time, and can reorder (or repeat) its cache rows before a step.
Greedy search, sampling and beam search below only see the logits it returns, so the same
options give the same tokens in both runtimes (same seed included).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import numpy as np

from transformer_kit.core.decoding.call import (
    DecodingCall,
    History,
    Stepper,
    _probabilities,
    sample_rows,
    stopped,
)
from transformer_kit.core.decoding.logprobs import log_softmax, pick, top_indices
from transformer_kit.core.decoding.options import GenerationConfig
from transformer_kit.core.decoding.processors import DecodingState, Pipeline
from transformer_kit.core.decoding.speculative import speculative_tokens

#: A finished beam hypothesis or a running one that has no valid continuation scores this.
_FINISHED = -1.0e9


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    logits = logits.astype(np.float32, copy=False)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def _repeat(call: DecodingCall, times: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rows = np.repeat(np.arange(len(call.prompt_ids)), times)
    return rows, call.prompt_ids[rows], call.prompt_real[rows]


def stream_tokens(stepper: Stepper, call: DecodingCall, options: GenerationConfig,
                  pipeline: Pipeline) -> Iterator[np.ndarray]:
    """Greedy search or sampling, one step at a time.

    Yields (rows,) int64 each step, rows = batch x num_return_sequences (the samples of one
    prompt are adjacent). A row that ended holds ``fill_id``; the stream ends when every row
    ended or after ``max_new_tokens``.

    Without processors the loop keeps no history and chooses from the runtime's logits as
    they are: after a short int4 step has left the caches cold, every small numpy call is
    slow, so the processors' state, the copy and the eos check are a cost worth skipping.
    With ``prompt_lookup_num_tokens`` or an assistant model:
    :func:`~transformer_kit.core.decoding.speculative.speculative_tokens`.
    """
    if options.prompt_lookup_num_tokens is not None or call.assistant is not None:
        yield from speculative_tokens(stepper, call, options, pipeline)
        return
    copies = options.num_return_sequences
    source, ids, real = _repeat(call, copies)
    rng = np.random.default_rng(options.seed) if options.do_sample else None
    finished, some_finished = np.zeros(len(ids), dtype=bool), False
    eos = frozenset(call.eos_ids)
    processing = len(pipeline) > 0
    history = History(ids, real) if processing and pipeline.reads_tokens else None
    width = call.prompt_ids.shape[1]
    new: list[np.ndarray] = []
    if options.max_new_tokens == 0:
        return
    logits = stepper.first()[source]
    reports, raw = options.logprobs, options.logprobs_mode == "raw"
    for step in range(options.max_new_tokens):
        if reports is not None and raw:  # before the processors change the logits in place
            logprobs = log_softmax(logits)
        # the stepper's logits are ours to change until the next step: processors work in place
        if processing:
            state = (history.state(width) if history is not None
                     else DecodingState(ids, real, width, generated=step))
            scores = pipeline(logits.astype(np.float32, copy=False), state)
        else:
            scores = logits
        chosen = sample_rows(scores, rng) if rng is not None else scores.argmax(axis=-1)
        token = (np.where(finished, call.fill_id, chosen) if some_finished else chosen
                 ).astype(np.int64, copy=False)
        new.append(token)
        if reports is not None:  # None for a row that ended before this step
            picked = pick(logprobs if raw else log_softmax(scores), token, reports)
            call.logprobs.append([None if gone else p for p, gone in zip(picked, finished.tolist(),
                                                                          strict=True)])
        ended = stopped(call, options, token, eos, new)
        if ended is not None:
            finished |= ended
            some_finished = True
        yield token
        if step + 1 == options.max_new_tokens or (some_finished and finished.all()):
            return
        if history is not None:
            history.append(token)
        logits = stepper.next(token, source if step == 0 and copies > 1 else None)


def generate_tokens(stepper: Stepper, call: DecodingCall, options: GenerationConfig,
                    pipeline: Pipeline) -> np.ndarray:
    """All new tokens: (batch x num_return_sequences, steps) int64, rows ended by ``fill_id``."""
    if options.num_beams > 1:
        return beam_search(stepper, call, options, pipeline)
    rows = len(call.prompt_ids) * options.num_return_sequences
    steps = list(stream_tokens(stepper, call, options, pipeline))
    return np.stack(steps, axis=1) if steps else np.zeros((rows, 0), dtype=np.int64)


def _gather(x: np.ndarray, index: np.ndarray) -> np.ndarray:
    """x (batch, beams, ...) gathered along axis 1 by index (batch, k)."""
    return np.take_along_axis(x, index.reshape(index.shape + (1,) * (x.ndim - 2)), axis=1)


class _Finished(NamedTuple):
    """Each prompt's best ``num_beams`` finished hypotheses: new tokens (batch, k, steps), their
    length-penalized scores (batch, k), lengths (batch, k) and whether each slot holds one."""

    new: np.ndarray
    scores: np.ndarray
    lengths: np.ndarray
    done: np.ndarray

    @classmethod
    def none(cls, batch: int, k: int, fill_id: int) -> _Finished:
        return cls(np.full((batch, k, 0), fill_id, dtype=np.int64),
                   np.full((batch, k), _FINISHED, dtype=np.float32),
                   np.zeros((batch, k), dtype=np.int64), np.zeros((batch, k), dtype=bool))

    def merged(self, top_new: np.ndarray, scores: np.ndarray, just_finished: np.ndarray,
               fill_id: int) -> _Finished:
        """The best ``k`` of these and the candidates ``top_new`` (batch, keep_k, step + 1)
        scored ``scores`` (``_FINISHED``: not finished, or not allowed to join)."""
        batch, k, length = self.scores.shape[0], self.scores.shape[1], top_new.shape[2]
        padded = np.full((batch, k, length), fill_id, dtype=np.int64)
        padded[:, :, :self.new.shape[2]] = self.new
        merged_new = np.concatenate([padded, top_new], axis=1)
        merged_scores = np.concatenate([self.scores, scores.astype(np.float32)], axis=1)
        merged_len = np.concatenate([self.lengths, np.full(scores.shape, length)], axis=1)
        merged_finished = np.concatenate([self.done, just_finished], axis=1)
        best = np.argsort(-merged_scores, axis=-1, kind="stable")[:, :k]
        return _Finished(_gather(merged_new, best), np.take_along_axis(merged_scores, best, -1),
                         np.take_along_axis(merged_len, best, -1),
                         np.take_along_axis(merged_finished, best, -1))

    def rows(self, n: int, fill_id: int) -> np.ndarray:
        """The best ``n`` of each prompt: (batch x n, steps) int64, ended by ``fill_id``."""
        lengths = self.lengths[:, :n].reshape(-1)
        out = self.new[:, :n].reshape(len(lengths), -1)
        steps = int(lengths.max()) if len(lengths) else 0
        out = out[:, :steps].copy()
        out[np.arange(steps)[None, :] >= lengths[:, None]] = fill_id
        return out


def _candidates(accumulated: np.ndarray, keep_k: int, rng: np.random.Generator | None) -> np.ndarray:
    """(batch, keep_k) indices into each row of ``accumulated`` (batch, beams x vocab): the
    largest scores, or drawn without replacement by their probabilities when sampling."""
    if rng is None:
        return top_indices(accumulated, keep_k)
    probs = _probabilities(accumulated)
    return np.stack([rng.choice(accumulated.shape[-1], keep_k, replace=False, p=p) for p in probs])


def _finishing_scores(top_scores: np.ndarray, just_finished: np.ndarray, finished: _Finished,
                      improvable: np.ndarray, length: int, options: GenerationConfig) -> np.ndarray:
    """The length-penalized scores of the candidates that finish at ``length``; ``_FINISHED``
    for the others and for every candidate of a prompt that is done (its hypotheses full with
    ``early_stopping=True``, or no longer improvable)."""
    scores = top_scores / (length ** options.length_penalty)
    full = finished.done.all(axis=-1, keepdims=True) & (options.early_stopping is True)
    scores = scores + full.astype(np.float32) * _FINISHED
    scores = scores + (~improvable).astype(np.float32) * _FINISHED
    return scores + (~just_finished).astype(np.float32) * _FINISHED


def _still_improvable(improvable: np.ndarray, running_scores: np.ndarray, finished: _Finished,
                      length: int, options: GenerationConfig) -> np.ndarray:
    """(batch, 1): whether a prompt's best running beam can still beat its worst finished
    hypothesis (at the longest length it may reach when ``early_stopping="never"``)."""
    lp = options.length_penalty
    best_len = (options.max_new_tokens if options.early_stopping == "never" and lp > 0 else length)
    best_running = running_scores[:, :1] / (best_len ** lp)
    worst = np.where(finished.done, finished.scores.min(axis=1, keepdims=True), _FINISHED)
    return improvable & (best_running > worst).any(axis=-1, keepdims=True)


def beam_search(stepper: Stepper, call: DecodingCall, options: GenerationConfig,
                pipeline: Pipeline) -> np.ndarray:
    """Beam search as ``transformers`` (4.50+) runs it, on numpy: the same candidates, scores,
    length penalty, early stopping rules and tie order, so the tokens are the same.

    Returns (batch x num_return_sequences, steps) int64: each prompt's best hypotheses first,
    rows ended by ``fill_id``.
    """
    k, n_eos = options.num_beams, len(call.eos_ids)
    batch, prompt_len = call.prompt_ids.shape
    keep_k = max(2, 1 + n_eos) * k
    rng = np.random.default_rng(options.seed) if options.do_sample else None
    flat_source, ids, real = _repeat(call, k)  # (batch * k, prompt_len)
    running_new = np.zeros((batch, k, 0), dtype=np.int64)  # tokens after the prompt
    running_scores = np.zeros((batch, k), dtype=np.float32)
    running_scores[:, 1:] = _FINISHED
    finished = _Finished.none(batch, k, call.fill_id)
    improvable = np.ones((batch, 1), dtype=bool)
    top_k_mask = np.arange(keep_k) < k
    logits = stepper.first()[flat_source]
    for step in range(options.max_new_tokens):
        state = DecodingState(np.concatenate([ids, running_new.reshape(batch * k, -1)], 1),
                              np.concatenate([real, np.ones((batch * k, step), bool)], 1),
                              prompt_len)
        log_probs = pipeline(_log_softmax(logits), state)
        vocab = log_probs.shape[-1]
        accumulated = (log_probs.reshape(batch, k, vocab) + running_scores[:, :, None])
        accumulated = accumulated.reshape(batch, k * vocab)
        top = _candidates(accumulated, keep_k, rng)
        top_scores = np.take_along_axis(accumulated, top, -1)
        top_beam, top_token = top // vocab, top % vocab
        top_new = np.concatenate([_gather(running_new, top_beam), top_token[:, :, None]], axis=2)
        hits = np.isin(top_token, call.eos_ids) | (step + 1 == options.max_new_tokens)
        if call.stop is not None and step + 1 >= options.min_new_tokens:
            hits |= call.stop(top_new.reshape(batch * keep_k, -1)).reshape(batch, keep_k)
        # the best num_beams candidates that did not finish keep running
        running_candidates = top_scores + hits.astype(np.float32) * _FINISHED
        chosen = np.argsort(-running_candidates, axis=-1, kind="stable")[:, :k]
        running_new = _gather(top_new, chosen)
        running_scores = np.take_along_axis(running_candidates, chosen, -1)
        source_beam = np.take_along_axis(top_beam, chosen, -1)
        # finished candidates among the top num_beams join the finished hypotheses if better
        just_finished = hits & top_k_mask[None, :]
        scores = _finishing_scores(top_scores, just_finished, finished, improvable, step + 1, options)
        finished = finished.merged(top_new, scores, just_finished, call.fill_id)
        # can a running beam still beat the worst finished one?
        improvable = _still_improvable(improvable, running_scores, finished, step + 1, options)
        going = (improvable.any() and not (finished.done.all() and options.early_stopping is True)
                 and not hits.all())
        if not going or step + 1 == options.max_new_tokens:
            break
        rows = (np.arange(batch)[:, None] * k + source_beam).reshape(-1)
        logits = stepper.next(running_new[:, :, -1].reshape(-1), flat_source[rows] if step == 0
                              else rows)
    return finished.rows(options.num_return_sequences, call.fill_id)
