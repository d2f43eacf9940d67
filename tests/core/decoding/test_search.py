"""The search helpers: beam search's partial top-k equals a stable full sort, ties included;
the sampler draws from the finite scores only."""

from __future__ import annotations

import numpy as np
import pytest

from transformer_kit.core.decoding.logprobs import top_indices
from transformer_kit.core.decoding.search import sample_rows


@pytest.mark.parametrize("vocab", [10, 100, 32000])
@pytest.mark.parametrize("k", [1, 2, 8])
def test_top_equals_a_stable_sort(vocab, k):
    x = np.random.default_rng(vocab + k).standard_normal((3, vocab)).astype(np.float32)
    x[0, :vocab // 2] = x[0, 0]  # a run of ties
    x[1, 5:] = -np.inf  # fewer finite scores than k
    np.testing.assert_array_equal(top_indices(x, k), np.argsort(-x, axis=-1, kind="stable")[:, :k])


def test_the_sampler_never_draws_a_removed_token():
    scores = np.full((4, 1000), -np.inf, np.float32)
    scores[:, [3, 500, 999]] = [0.0, 1.0, 2.0]
    draws = np.concatenate([sample_rows(scores, np.random.default_rng(seed)) for seed in range(200)])
    assert set(draws.tolist()) == {3, 500, 999}


class _ScriptedSteps:
    """A stepper whose logits pick the scripted token of each row at each step."""

    def __init__(self, script: np.ndarray, vocab: int = 50) -> None:
        self.script, self.vocab, self.step = script, vocab, 0

    def _logits(self) -> np.ndarray:
        logits = np.zeros((len(self.script), self.vocab), np.float32)
        logits[np.arange(len(self.script)), self.script[:, self.step]] = 1.0
        return logits

    def first(self) -> np.ndarray:
        return self._logits()

    def next(self, tokens: np.ndarray, rows: np.ndarray | None) -> np.ndarray:
        self.step += 1
        return self._logits()


def test_processors_see_every_row_prompt_and_tokens_so_far_as_the_history_grows():
    from transformer_kit.core.decoding import DecodingCall, GenerationConfig, Pipeline, stream_tokens
    from transformer_kit.core.decoding.processors import DecodingState

    rng = np.random.default_rng(0)
    prompt = rng.integers(3, 50, (2, 3))
    real = np.array([[False, True, True], [True, True, True]])
    script = rng.integers(3, 50, (2, 40))  # 40 steps: the history's buffers double twice
    seen: list[DecodingState] = []

    def record(scores: np.ndarray, state: DecodingState) -> np.ndarray:
        seen.append(DecodingState(state.ids.copy(), state.real.copy(), state.prompt_length))
        return scores

    call = DecodingCall(prompt, real, eos_ids=[2], fill_id=0)
    tokens = np.stack(list(stream_tokens(_ScriptedSteps(script), call,
                                         GenerationConfig(max_new_tokens=40), Pipeline([record]))), 1)
    np.testing.assert_array_equal(tokens, script)
    assert len(seen) == 40
    for step, state in enumerate(seen):
        np.testing.assert_array_equal(state.ids, np.concatenate([prompt, script[:, :step]], 1))
        np.testing.assert_array_equal(state.real[:, :3], real)
        assert state.real[:, 3:].all() and state.new_tokens == step


def test_a_row_ends_at_its_eos_and_holds_the_fill_id_after_it():
    from transformer_kit.core.decoding import DecodingCall, GenerationConfig, Pipeline, stream_tokens

    script = np.array([[5, 2, 7, 8], [5, 6, 7, 9], [9, 9, 4, 2]])  # eos 2 and 4
    call = DecodingCall(np.ones((3, 2), np.int64), np.ones((3, 2), bool), eos_ids=[2, 4], fill_id=0)
    tokens = np.stack(list(stream_tokens(_ScriptedSteps(script), call,
                                         GenerationConfig(max_new_tokens=4), Pipeline([]))), 1)
    np.testing.assert_array_equal(tokens, [[5, 2, 0, 0], [5, 6, 7, 9], [9, 9, 4, 0]])
