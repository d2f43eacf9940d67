"""The built-in logits processors keep, drop and scale exactly what transformers' processors
of the same role do, on random scores over small and GPT-2-sized vocabularies; OpenAI's
presence and frequency penalties, which transformers lacks, are checked against their formula
on arrays made by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers.generation.logits_process as hf

from transformer_kit.core.decoding import DecodingState
from transformer_kit.plugins.logits import (
    LogitBias,
    MinNewTokens,
    MinP,
    NoRepeatNGram,
    PresenceFrequencyPenalty,
    RepetitionPenalty,
    Temperature,
    TopK,
    TopP,
)


def _scores(vocab: int, spread: float, seed: int = 0) -> np.ndarray:
    return (spread * np.random.default_rng(seed).standard_normal((3, vocab))).astype(np.float32)


def _state(ids: np.ndarray, prompt_length: int) -> DecodingState:
    return DecodingState(ids, np.ones(ids.shape, bool), prompt_length)


def _same(ours: np.ndarray, theirs: torch.Tensor) -> None:
    theirs = theirs.numpy()
    np.testing.assert_array_equal(np.isfinite(ours), np.isfinite(theirs))
    np.testing.assert_allclose(ours[np.isfinite(ours)], theirs[np.isfinite(theirs)], rtol=1e-6)


WARPERS = [
    (lambda: Temperature(0.7), lambda: hf.TemperatureLogitsWarper(0.7)),
    (lambda: TopK(40), lambda: hf.TopKLogitsWarper(40)),
    (lambda: TopP(0.9), lambda: hf.TopPLogitsWarper(0.9)),
    (lambda: TopP(0.3, min_tokens_to_keep=2), lambda: hf.TopPLogitsWarper(0.3, min_tokens_to_keep=2)),
    (lambda: MinP(0.1), lambda: hf.MinPLogitsWarper(0.1)),
]


@pytest.mark.parametrize("vocab", [61, 8000, 50257])
@pytest.mark.parametrize("spread", [1.0, 3.0, 10.0])  # flat to peaked: top-p's three paths
@pytest.mark.parametrize("index", range(len(WARPERS)))
def test_warpers_equal_transformers(vocab, spread, index):
    ours, theirs = WARPERS[index]
    scores = _scores(vocab, spread)
    state = _state(np.zeros((3, 1), np.int64), 1)
    _same(ours()(scores.copy(), state), theirs()(None, torch.from_numpy(scores.copy())))
    cut = TopK(100)(scores.copy(), state)  # after top-k, as the pipeline runs them
    _same(ours()(cut.copy(), state), theirs()(None, torch.from_numpy(cut.copy())))


@pytest.mark.parametrize("value", [1e-30, 1e-40, 1e-300, 5e-324])
def test_a_tiny_temperature_keeps_the_best_tokens_not_nan(value):
    scores = _scores(61, 10.0) - 50.0  # all negative: divided alone, a row would be all -inf
    scores[1, :3] = scores[1].max() + 1.0  # a tie for the best
    out = Temperature(value)(scores.copy(), _state(np.zeros((3, 1), np.int64), 1)).astype(np.float64)
    best = scores == scores.max(axis=-1, keepdims=True)
    assert not np.isnan(out).any()
    probabilities = np.exp(out - out.max(axis=-1, keepdims=True))
    probabilities /= probabilities.sum(axis=-1, keepdims=True)
    np.testing.assert_array_equal(probabilities, np.where(best, 1.0 / best.sum(-1, keepdims=True), 0.0))


def test_penalties_equal_transformers():
    scores = _scores(61, 2.0)
    ids = np.random.default_rng(1).integers(0, 61, (3, 12))
    state = _state(ids, 5)
    _same(RepetitionPenalty(1.3)(scores.copy(), state),
          hf.RepetitionPenaltyLogitsProcessor(1.3)(torch.from_numpy(ids), torch.from_numpy(scores.copy())))
    repeats = np.tile(np.array([[4, 5, 6, 4, 5]]), (3, 1))
    for size in (1, 2, 3):
        _same(NoRepeatNGram(size)(scores.copy(), _state(repeats, 2)),
              hf.NoRepeatNGramLogitsProcessor(size)(torch.from_numpy(repeats),
                                                   torch.from_numpy(scores.copy())))
    eos = [2, 7]
    early = MinNewTokens(4, eos)(scores.copy(), _state(ids[:, :7], 5))  # 2 new tokens < 4
    assert np.isneginf(early[:, eos]).all() and np.isfinite(np.delete(early, eos, axis=1)).all()
    np.testing.assert_array_equal(MinNewTokens(4, eos)(scores.copy(), _state(ids[:, :9], 5)), scores)


def test_padding_is_not_a_repeated_token():
    scores = np.zeros((1, 10), np.float32) + 1.0
    state = DecodingState(np.array([[0, 0, 3]]), np.array([[False, False, True]]), 3)
    out = RepetitionPenalty(2.0)(scores, state)
    assert out[0, 3] == 0.5 and out[0, 0] == 1.0  # id 0 only appears as padding


@pytest.mark.parametrize(("presence", "frequency"), [(0.5, 0.0), (0.0, 0.7), (1.5, -0.4), (-2.0, 2.0)])
def test_presence_and_frequency_penalties_follow_openais_formula(presence, frequency):
    """scores[t] -= presence * (count[t] > 0) + frequency * count[t], the counts over the tokens
    generated so far only: a token of the prompt (or padding) is not counted."""
    scores = _scores(10, 2.0)
    ids = np.array([[1, 2, 3, 4, 4, 4, 7],    # prompt 1 2 3, then 4 three times and 7
                    [0, 0, 5, 5, 1, 1, 1],    # padded prompt 5; then 5 once and 1 three times
                    [9, 9, 9, 9, 9, 9, 9]])   # 9 in the prompt and four times after it
    real = np.ones(ids.shape, bool)
    real[1, :2] = False
    generated = {0: {4: 3, 7: 1}, 1: {5: 1, 1: 3}, 2: {9: 4}}
    expected = scores.copy()
    for row, counts in generated.items():
        for token, count in counts.items():
            expected[row, token] -= presence + frequency * count
    out = PresenceFrequencyPenalty(presence, frequency)(scores.copy(), DecodingState(ids, real, 3))
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-6)
    untouched = PresenceFrequencyPenalty(presence, frequency)(scores.copy(), _state(ids[:, :3], 3))
    np.testing.assert_array_equal(untouched, scores)  # nothing generated yet: the prompt is not counted


def test_a_logit_bias_equals_transformers_sequence_bias_of_single_tokens():
    scores = _scores(61, 2.0)
    scores[0, 7] = -np.inf  # a token a processor before it removed stays removed
    bias = {3: 5.0, 7: -100.0, 60: 2.5, 0: -1.0}
    ids = np.random.default_rng(1).integers(0, 61, (3, 6))
    reference = hf.SequenceBiasLogitsProcessor([[[token], value] for token, value in bias.items()])
    _same(LogitBias(bias, 61)(scores.copy(), _state(ids, 6)),
          reference(torch.from_numpy(ids), torch.from_numpy(scores.copy())))


@pytest.mark.parametrize("bad", [lambda: TopP(0), lambda: TopK(0), lambda: Temperature(-1),
                                 lambda: MinP(1.5), lambda: RepetitionPenalty(0),
                                 lambda: NoRepeatNGram(0), lambda: PresenceFrequencyPenalty(float("nan")),
                                 lambda: LogitBias({61: 1.0}, 61), lambda: LogitBias({}, 61),
                                 lambda: LogitBias({2: float("inf")}, 61)])
def test_bad_parameters_raise(bad):
    with pytest.raises(ValueError):
        bad()
