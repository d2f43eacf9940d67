"""Token timestamps' pieces against their definitions: the median filter against SciPy's (mirrored
edges), the time warping's path against the cheapest of every monotonic path through small
matrices; their use on real speech is checked against transformers in
tests/plugins/families/test_whisper_tiny_en.py."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy import ndimage

from transformer_kit.core.speech.alignment import dynamic_time_warping, median_filter, token_times


@pytest.mark.parametrize("width", [1, 3, 7])
def test_median_filter_equals_scipy(width):
    x = np.random.default_rng(width).standard_normal((2, 5, 40)).astype(np.float32)
    # numpy's "reflect" padding (the edge not repeated) is SciPy's "mirror"
    expected = ndimage.median_filter(x, size=(1, 1, width), mode="mirror")
    np.testing.assert_array_equal(median_filter(x, width), expected)


def test_median_filter_leaves_an_axis_shorter_than_its_reach():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(median_filter(x, 7), x)


def _paths(rows: int, cols: int):
    """Every monotonic path from (0, 0) to (rows - 1, cols - 1) stepping down, right or both."""
    def walk(i, j):
        if (i, j) == (rows - 1, cols - 1):
            yield [(i, j)]
            return
        for di, dj in ((1, 1), (1, 0), (0, 1)):
            if i + di < rows and j + dj < cols:
                for rest in walk(i + di, j + dj):
                    yield [(i, j), *rest]
    return walk(0, 0)


@pytest.mark.parametrize(("rows", "cols"), [(1, 1), (1, 4), (4, 1), (3, 5), (5, 6)])
def test_time_warping_takes_the_cheapest_path(rows, cols):
    matrix = np.random.default_rng(rows * 10 + cols).standard_normal((rows, cols))
    text, time = dynamic_time_warping(matrix)
    steps = set(zip(np.diff(text).tolist(), np.diff(time).tolist(), strict=True))
    assert (text[0], time[0], text[-1], time[-1]) == (0, 0, rows - 1, cols - 1)
    assert steps <= {(1, 1), (1, 0), (0, 1)}
    cheapest = min(sum(matrix[i, j] for i, j in path) for path in _paths(rows, cols))
    assert matrix[text, time].sum() == pytest.approx(cheapest, rel=1e-5)


def test_token_times_follow_the_attended_frames():
    """Heads that attend token k to frames 10k..10k+9 time token k + 1 at 0.2k s (the path
    reaches input row k there; the first token is the path's start, 0)."""
    tokens, frames = 6, 200
    weights = np.full((2, tokens - 1, frames // 2), 0.01, np.float32)
    for k in range(tokens - 1):
        weights[:, k, 10 * k:10 * k + 10] = 1.0
    times = token_times(weights, frames, median_width=7)
    np.testing.assert_allclose(times, [0.0, 0.2, 0.4, 0.6, 0.8, 0.8])
    assert list(itertools.accumulate(times, max)) == list(times)
