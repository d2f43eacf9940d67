"""The search helpers: beam search's partial top-k equals a stable full sort, ties included;
the sampler draws from the finite scores only."""

from __future__ import annotations

import numpy as np
import pytest

from transformer_kit.decoding.search import _top, sample_rows


@pytest.mark.parametrize("vocab", [10, 100, 32000])
@pytest.mark.parametrize("k", [1, 2, 8])
def test_top_equals_a_stable_sort(vocab, k):
    x = np.random.default_rng(vocab + k).standard_normal((3, vocab)).astype(np.float32)
    x[0, :vocab // 2] = x[0, 0]  # a run of ties
    x[1, 5:] = -np.inf  # fewer finite scores than k
    np.testing.assert_array_equal(_top(x, k), np.argsort(-x, axis=-1, kind="stable")[:, :k])


def test_the_sampler_never_draws_a_removed_token():
    scores = np.full((4, 1000), -np.inf, np.float32)
    scores[:, [3, 500, 999]] = [0.0, 1.0, 2.0]
    draws = np.concatenate([sample_rows(scores, np.random.default_rng(seed)) for seed in range(200)])
    assert set(draws.tolist()) == {3, 500, 999}
