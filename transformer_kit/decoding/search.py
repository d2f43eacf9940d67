"""The decoding strategies, written once on numpy next-token logits for every runtime.

A runtime (PyTorch model, onnxruntime graphs) implements :class:`Stepper`: it runs the prompt,
then one token per row at a time, and can reorder (or repeat) its cache rows before a step.
Greedy search, sampling and beam search below only see the logits it returns, so the same
options give the same tokens in both runtimes (same seed included).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from transformer_kit.decoding.options import GenerationConfig
from transformer_kit.decoding.problem import (
    History,
    Problem,
    Stepper,
    _probabilities,
    sample_rows,
    stopped,
)
from transformer_kit.decoding.processors import DecodingState, Pipeline
from transformer_kit.decoding.speculative import speculative_tokens

#: A finished beam hypothesis or a running one that has no valid continuation scores this.
_FINISHED = -1.0e9


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    logits = logits.astype(np.float32, copy=False)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def _repeat(problem: Problem, times: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rows = np.repeat(np.arange(len(problem.prompt_ids)), times)
    return rows, problem.prompt_ids[rows], problem.prompt_keep[rows]


def stream_tokens(stepper: Stepper, problem: Problem, options: GenerationConfig,
                  pipeline: Pipeline) -> Iterator[np.ndarray]:
    """Greedy search or sampling, one step at a time.

    Yields (rows,) int64 each step, rows = batch x num_return_sequences (the samples of one
    prompt are adjacent). A row that ended holds ``fill_id``; the stream ends when every row
    ended or after ``max_new_tokens``.

    Without processors the loop keeps no history and chooses from the runtime's logits as
    they are: after a 1 ms int4 step has left the caches cold, every small numpy call costs
    microseconds, and the processors' state, the copy and the eos check cost about 40 us a token.
    With ``prompt_lookup_num_tokens`` or an assistant model:
    :func:`~transformer_kit.decoding.speculative.speculative_tokens`.
    """
    if options.prompt_lookup_num_tokens is not None or problem.assistant is not None:
        yield from speculative_tokens(stepper, problem, options, pipeline)
        return
    copies = options.num_return_sequences
    source, ids, keep = _repeat(problem, copies)
    rng = np.random.default_rng(options.seed) if options.do_sample else None
    finished, some_finished = np.zeros(len(ids), dtype=bool), False
    eos = frozenset(problem.eos_ids)
    processing = len(pipeline) > 0
    history = History(ids, keep) if processing and pipeline.reads_tokens else None
    width = problem.prompt_ids.shape[1]
    new: list[np.ndarray] = []
    if options.max_new_tokens == 0:
        return
    logits = stepper.first()[source]
    for step in range(options.max_new_tokens):
        # the stepper's logits are ours to change until the next step: processors work in place
        if processing:
            state = (history.state(width) if history is not None
                     else DecodingState(ids, keep, width, generated=step))
            scores = pipeline(logits.astype(np.float32, copy=False), state)
        else:
            scores = logits
        chosen = sample_rows(scores, rng) if rng is not None else scores.argmax(axis=-1)
        token = (np.where(finished, problem.fill_id, chosen) if some_finished else chosen
                 ).astype(np.int64, copy=False)
        new.append(token)
        ended = stopped(problem, options, token, eos, new)
        if ended is not None:
            finished |= ended
            some_finished = True
        yield token
        if step + 1 == options.max_new_tokens or (some_finished and finished.all()):
            return
        if history is not None:
            history.append(token)
        logits = stepper.next(token, source if step == 0 and copies > 1 else None)


def generate_tokens(stepper: Stepper, problem: Problem, options: GenerationConfig,
                    pipeline: Pipeline) -> np.ndarray:
    """All new tokens: (batch x num_return_sequences, steps) int64, rows ended by ``fill_id``."""
    if options.num_beams > 1:
        return beam_search(stepper, problem, options, pipeline)
    rows = len(problem.prompt_ids) * options.num_return_sequences
    steps = list(stream_tokens(stepper, problem, options, pipeline))
    return np.stack(steps, axis=1) if steps else np.zeros((rows, 0), dtype=np.int64)


def _top(x: np.ndarray, k: int) -> np.ndarray:
    """(rows, k) indices of each row's k largest values, largest first, ties by lower index
    (what a stable argsort of -x gives), without sorting the whole row."""
    if 4 * k >= x.shape[-1]:
        return np.argsort(-x, axis=-1, kind="stable")[:, :k]
    n = x.shape[-1]
    kth = np.partition(x, n - k, axis=-1)[:, n - k:n - k + 1]  # each row's k-th largest
    rows = []
    for values, bound in zip(x, kth, strict=True):
        candidates = np.flatnonzero(values >= bound)  # the k largest and any tie at the k-th
        rows.append(candidates[np.argsort(-values[candidates], kind="stable")[:k]])
    return np.stack(rows)


def _gather(x: np.ndarray, index: np.ndarray) -> np.ndarray:
    """x (batch, beams, ...) gathered along axis 1 by index (batch, k)."""
    return np.take_along_axis(x, index.reshape(index.shape + (1,) * (x.ndim - 2)), axis=1)


def beam_search(stepper: Stepper, problem: Problem, options: GenerationConfig,
                pipeline: Pipeline) -> np.ndarray:
    """Beam search as ``transformers`` (4.50+) runs it, on numpy: the same candidates, scores,
    length penalty, early stopping rules and tie order, so the tokens are the same.

    Returns (batch x num_return_sequences, steps) int64: each prompt's best hypotheses first,
    rows ended by ``fill_id``.
    """
    k, n_eos = options.num_beams, len(problem.eos_ids)
    lp, early = options.length_penalty, options.early_stopping
    batch, prompt_len = problem.prompt_ids.shape
    keep_k = max(2, 1 + n_eos) * k
    rng = np.random.default_rng(options.seed) if options.do_sample else None
    flat_source, ids, keep = _repeat(problem, k)  # (batch * k, prompt_len)
    running_new = np.zeros((batch, k, 0), dtype=np.int64)  # tokens after the prompt
    running_scores = np.zeros((batch, k), dtype=np.float32)
    running_scores[:, 1:] = _FINISHED
    finished_new = np.full((batch, k, 0), problem.fill_id, dtype=np.int64)
    finished_scores = np.full((batch, k), _FINISHED, dtype=np.float32)
    finished_len = np.zeros((batch, k), dtype=np.int64)
    is_finished = np.zeros((batch, k), dtype=bool)
    improvable = np.ones((batch, 1), dtype=bool)
    top_k_mask = np.arange(keep_k) < k
    logits = stepper.first()[flat_source]
    for step in range(options.max_new_tokens):
        state = DecodingState(np.concatenate([ids, running_new.reshape(batch * k, -1)], 1),
                              np.concatenate([keep, np.ones((batch * k, step), bool)], 1),
                              prompt_len)
        log_probs = pipeline(_log_softmax(logits), state)
        vocab = log_probs.shape[-1]
        accumulated = (log_probs.reshape(batch, k, vocab) + running_scores[:, :, None])
        accumulated = accumulated.reshape(batch, k * vocab)
        if rng is not None:
            probs = _probabilities(accumulated)
            top = np.stack([rng.choice(k * vocab, keep_k, replace=False, p=p) for p in probs])
        else:
            top = _top(accumulated, keep_k)
        top_scores = np.take_along_axis(accumulated, top, -1)
        top_beam, top_token = top // vocab, top % vocab
        top_new = np.concatenate([_gather(running_new, top_beam), top_token[:, :, None]], axis=2)
        hits = np.isin(top_token, problem.eos_ids) | (step + 1 == options.max_new_tokens)
        if problem.stop is not None and step + 1 >= options.min_new_tokens:
            hits |= problem.stop(top_new.reshape(batch * keep_k, -1)).reshape(batch, keep_k)
        # the best num_beams candidates that did not finish keep running
        running_candidates = top_scores + hits.astype(np.float32) * _FINISHED
        chosen = np.argsort(-running_candidates, axis=-1, kind="stable")[:, :k]
        running_new = _gather(top_new, chosen)
        running_scores = np.take_along_axis(running_candidates, chosen, -1)
        source_beam = np.take_along_axis(top_beam, chosen, -1)
        # finished candidates among the top num_beams join the finished hypotheses if better
        just_finished = hits & top_k_mask[None, :]
        scores = top_scores / ((step + 1) ** lp)
        full = is_finished.all(axis=-1, keepdims=True) & (early is True)
        scores = scores + full.astype(np.float32) * _FINISHED
        scores = scores + (~improvable).astype(np.float32) * _FINISHED
        scores = scores + (~just_finished).astype(np.float32) * _FINISHED
        padded = np.full((batch, k, step + 1), problem.fill_id, dtype=np.int64)
        padded[:, :, :finished_new.shape[2]] = finished_new
        merged_new = np.concatenate([padded, top_new], axis=1)
        merged_scores = np.concatenate([finished_scores, scores.astype(np.float32)], axis=1)
        merged_len = np.concatenate([finished_len, np.full((batch, keep_k), step + 1)], axis=1)
        merged_finished = np.concatenate([is_finished, just_finished], axis=1)
        best = np.argsort(-merged_scores, axis=-1, kind="stable")[:, :k]
        finished_new = _gather(merged_new, best)
        finished_scores = np.take_along_axis(merged_scores, best, -1)
        finished_len = np.take_along_axis(merged_len, best, -1)
        is_finished = np.take_along_axis(merged_finished, best, -1)
        # can a running beam still beat the worst finished one?
        new_len = step + 1
        best_len = (options.max_new_tokens if early == "never" and lp > 0 else new_len)
        best_running = running_scores[:, :1] / (best_len ** lp)
        worst = np.where(is_finished, finished_scores.min(axis=1, keepdims=True), _FINISHED)
        improvable = improvable & (best_running > worst).any(axis=-1, keepdims=True)
        going = improvable.any() and not (is_finished.all() and early is True) and not hits.all()
        if not going or step + 1 == options.max_new_tokens:
            break
        rows = (np.arange(batch)[:, None] * k + source_beam).reshape(-1)
        logits = stepper.next(running_new[:, :, -1].reshape(-1), flat_source[rows] if step == 0
                              else rows)
    keep_n = options.num_return_sequences
    lengths = finished_len[:, :keep_n].reshape(-1)
    out = finished_new[:, :keep_n].reshape(batch * keep_n, -1)
    steps = int(lengths.max()) if len(lengths) else 0
    out = out[:, :steps].copy()
    out[np.arange(steps)[None, :] >= lengths[:, None]] = problem.fill_id
    return out
