"""plan_batches: longest first, every input once, cut by rows, by padded tokens and where
padding a much shorter input would cost more than running it apart."""

from __future__ import annotations

import numpy as np
import pytest

from transformer_kit.core.embedding.batches import PAD_FRACTION, PAD_SLACK, plan_batches
from transformer_kit.core.errors import InputError


def _plan(lengths, **options):
    tokens = [[i + 1] * n for i, n in enumerate(lengths)]
    return tokens, list(plan_batches(tokens, [[7] * len(t) for t in tokens], **options))


def test_every_input_runs_once_longest_first_right_padded():
    tokens, batches = _plan([3, 9, 5, 9, 1], batch_size=2, pad_id=0)
    assert sorted(int(r) for b in batches for r in b.rows) == [0, 1, 2, 3, 4]
    for batch in batches:
        lengths = batch.real.sum(axis=1)
        assert list(lengths) == sorted(lengths, reverse=True)
        for row, index in enumerate(batch.rows):
            n = len(tokens[index])
            assert batch.ids[row, :n].tolist() == tokens[index] and not batch.ids[row, n:].any()
            assert batch.extra[row, :n].tolist() == [7] * n and not batch.extra[row, n:].any()


def test_runs_keep_to_rows_and_padded_tokens():
    _, batches = _plan([10] * 7, batch_size=3)
    assert [len(b.rows) for b in batches] == [3, 3, 1]
    _, batches = _plan([10] * 7, batch_size=32, max_batch_tokens=25)
    assert [len(b.rows) for b in batches] == [2, 2, 2, 1]
    _, batches = _plan([40, 10], max_batch_tokens=25)  # too long for the budget: alone
    assert [b.ids.shape for b in batches] == [(1, 40), (1, 10)]


def test_a_much_shorter_input_starts_a_run_of_its_own():
    long = 200
    near, far = long - int(PAD_FRACTION * long), long - int(PAD_FRACTION * long) - 1
    _, batches = _plan([long, near, far])
    assert [b.ids.shape for b in batches] == [(2, long), (1, far)]
    _, batches = _plan([20, 20 - PAD_SLACK, 2])  # short texts: within the slack of tokens
    assert [b.ids.shape for b in batches] == [(2, 20), (1, 2)]


@pytest.mark.parametrize("options", [{"batch_size": 0}, {"batch_size": True},
                                     {"max_batch_tokens": 0}, {"max_batch_tokens": 2.5}])
def test_bad_budgets_are_refused(options):
    with pytest.raises(InputError, match="must be a positive integer"):
        _plan([3], **options)


def test_nothing_in_nothing_out():
    assert list(plan_batches([], [])) == []
    assert np.array_equal(_plan([4])[1][0].rows, [0])
