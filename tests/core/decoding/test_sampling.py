"""Sampling: one seed, one sequence in both runtimes; the draws follow the processed softmax,
which transformers' own warpers compute for the same logits."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import transformers.generation.logits_process as hf_lp

from transformer_kit.core.decoding import DecodingState, build_pipeline, generation_config
from transformer_kit.core.decoding.search import sample_rows

DRAWS = 20_000


def test_the_same_seed_gives_the_same_tokens_in_both_runtimes(runtimes, prompts):
    model, onnx_model = runtimes
    options = {"do_sample": True, "temperature": 0.9, "top_k": 20, "top_p": 0.95, "seed": 11,
               "num_return_sequences": 2}
    ours = model.generate(prompts, 12, **options).numpy()
    assert ours.shape == (6, 12)
    np.testing.assert_array_equal(onnx_model.generate(prompts.numpy(), 12, **options), ours)
    np.testing.assert_array_equal(model.generate(prompts, 12, **options).numpy(), ours)  # again
    other = model.generate(prompts, 12, **{**options, "seed": 12}).numpy()
    assert (other != ours).mean() > 0.2  # a different seed draws differently
    assert (ours[0::2] != ours[1::2]).any()  # the two samples of a prompt differ


def test_top_k_1_is_greedy(runtimes, prompts):
    model, onnx_model = runtimes
    greedy = model.generate(prompts, 10).numpy()
    np.testing.assert_array_equal(model.generate(prompts, 10, do_sample=True, top_k=1, seed=3).numpy(),
                                  greedy)
    np.testing.assert_array_equal(onnx_model.generate(prompts.numpy(), 10, do_sample=True, top_k=1,
                                                      seed=4), greedy)


def test_beam_sampling_is_seeded_and_the_same_in_both_runtimes(runtimes, prompts):
    model, onnx_model = runtimes
    options = {"do_sample": True, "num_beams": 3, "num_return_sequences": 2, "seed": 5}
    ours = model.generate(prompts, 8, **options).numpy()
    np.testing.assert_array_equal(onnx_model.generate(prompts.numpy(), 8, **options), ours)


WARPERS = {
    "temperature": ({"temperature": 0.6}, [hf_lp.TemperatureLogitsWarper(0.6)]),
    "top_k": ({"top_k": 7}, [hf_lp.TopKLogitsWarper(7)]),
    "top_p": ({"top_p": 0.8}, [hf_lp.TopPLogitsWarper(0.8)]),
    "min_p": ({"min_p": 0.2}, [hf_lp.MinPLogitsWarper(0.2)]),
    "all": ({"temperature": 1.5, "top_k": 12, "top_p": 0.9, "min_p": 0.05},
            [hf_lp.TemperatureLogitsWarper(1.5), hf_lp.TopKLogitsWarper(12),
             hf_lp.TopPLogitsWarper(0.9), hf_lp.MinPLogitsWarper(0.05)]),
}


def _chi_square_limit(dof: int, z: float = 3.719) -> float:
    """The chi-square quantile at p = 1 - 1e-4 (z of the normal), Wilson-Hilferty."""
    a = 2 / (9 * dof)
    return dof * (1 - a + z * math.sqrt(a)) ** 3


@pytest.mark.parametrize("name", list(WARPERS))
def test_draws_follow_the_processed_softmax(runtimes, prompts, name):
    model, _ = runtimes
    options, hf_warpers = WARPERS[name]
    with torch.no_grad():
        logits = model(prompts)[0, -1:].float()  # (1, vocab): one real next-token distribution
    expected = logits
    for warper in hf_warpers:  # transformers' warpers give the reference distribution
        expected = warper(torch.zeros(1, 1, dtype=torch.long), expected)
    expected = torch.softmax(expected, -1)[0].double().numpy()
    _, pipeline = build_pipeline(generation_config(do_sample=True, **options), logits.shape[-1], [2])
    rows = np.repeat(logits.numpy(), DRAWS, axis=0)
    state = DecodingState(np.zeros((DRAWS, 1), np.int64), np.ones((DRAWS, 1), bool), 1)
    draws = sample_rows(pipeline(rows, state), np.random.default_rng(0))
    counts = np.bincount(draws, minlength=len(expected))
    support = expected > 0
    assert counts[~support].sum() == 0  # a token the warpers removed is never drawn
    assert support.sum() >= 2
    observed, wanted = counts[support], DRAWS * expected[support]
    chi_square = float(((observed - wanted) ** 2 / wanted).sum())
    assert chi_square < _chi_square_limit(int(support.sum()) - 1), (chi_square, support.sum())
    if name != "temperature":  # the warper really cut the distribution
        assert support.sum() < len(expected)


def test_sampling_from_a_wrong_distribution_fails_the_check(runtimes, prompts):
    """The chi-square check has power: temperature 0.6 draws against the plain softmax fail."""
    model, _ = runtimes
    with torch.no_grad():
        logits = model(prompts)[0, -1:].float()
    expected = torch.softmax(logits, -1)[0].double().numpy()
    _, pipeline = build_pipeline(generation_config(do_sample=True, temperature=0.6), 40, [2])
    rows = np.repeat(logits.numpy(), DRAWS, axis=0)
    state = DecodingState(np.zeros((DRAWS, 1), np.int64), np.ones((DRAWS, 1), bool), 1)
    counts = np.bincount(sample_rows(pipeline(rows, state), np.random.default_rng(0)), minlength=40)
    wanted = DRAWS * expected
    chi_square = float(((counts - wanted) ** 2 / wanted).sum())
    assert chi_square > _chi_square_limit(39)
