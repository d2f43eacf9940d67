"""A third-party logits processor, registered by a plugin, works in both runtimes."""

from __future__ import annotations

import numpy as np
import pytest

import transformer_kit as tk
from transformer_kit.core.decoding import DecodingState


class BanTokens(tk.LogitsProcessor):
    """Tokens ``ids`` are never chosen."""

    def __init__(self, ids: list[int], vocab_size: int) -> None:
        if any(not 0 <= i < vocab_size for i in ids):
            raise ValueError(f"ids must be within [0, {vocab_size}), got {ids}")
        self.ids = list(ids)

    def __call__(self, scores: np.ndarray, state: DecodingState) -> np.ndarray:
        scores = scores.copy()
        scores[:, self.ids] = -np.inf
        return scores


class BanPlugin:
    @tk.hookimpl
    def transformer_kit_components(self):
        return [tk.Component("logits_processor", "ban_tokens", BanTokens,
                             description="never choose the given ids")]


@pytest.fixture
def ban_plugin():
    name = tk.register_plugin(BanPlugin(), name="ban-tokens-test")
    yield name
    tk.unregister_plugin(name)


def test_a_plugin_processor_bans_its_tokens_in_both_runtimes(runtimes, prompts, ban_plugin):
    model, onnx_model = runtimes
    greedy = model.generate(prompts, 10).numpy()
    banned = sorted({int(t) for t in greedy[:, :3].reshape(-1)})  # tokens greedy would choose
    options = {"logits_processors": [{"name": "ban_tokens", "ids": banned}]}
    for extra in ({}, {"num_beams": 3}, {"do_sample": True, "seed": 1}):
        ours = model.generate(prompts, 10, **options, **extra).numpy()
        assert not np.isin(ours, banned).any()
        np.testing.assert_array_equal(onnx_model.generate(prompts.numpy(), 10, **options, **extra), ours)
    assert (ours != greedy).any()


def test_a_bad_processor_parameter_is_a_config_error(runtimes, prompts, ban_plugin):
    model, _ = runtimes
    with pytest.raises(tk.ConfigError, match=r"ban_tokens.*within \[0, 40\)"):
        model.generate(prompts, 4, logits_processors=[{"name": "ban_tokens", "ids": [99]}])


class BanUntil(tk.LogitsProcessor):
    """Token ``token_id`` is never chosen before ``count`` new tokens; it reads no tokens."""

    reads_tokens = False

    def __init__(self, token_id: int, count: int) -> None:
        self.token_id, self.count = token_id, count
        self.seen: list[int] = []

    def __call__(self, scores: np.ndarray, state: DecodingState) -> np.ndarray:
        self.seen.append(state.new_tokens)
        if state.new_tokens < self.count:
            scores[:, self.token_id] = -np.inf
        return scores


def test_a_processor_that_reads_no_tokens_counts_them_as_one_that_does(runtimes, prompts):
    """Without a history the loop still tells ``new_tokens``, and the tokens are those of the
    same processor run with the history kept."""
    _, onnx_model = runtimes
    greedy = onnx_model.generate(prompts.numpy(), 8)
    token = int(greedy[0, 0])  # the first token greedy chooses in row 0
    blind = BanUntil(token, 3)
    reading = BanUntil(token, 3)
    reading.reads_tokens = True  # the loop keeps the history for this one
    name = tk.register_plugin(_Processors({"blind": blind, "reading": reading}), name="ban-until-test")
    try:
        ours = {key: onnx_model.generate(prompts.numpy(), 8, logits_processors=[{"name": key}])
                for key in ("blind", "reading")}
    finally:
        tk.unregister_plugin(name)
    np.testing.assert_array_equal(ours["blind"], ours["reading"])
    assert (ours["blind"][0, :3] != token).all() and (ours["blind"] != greedy).any()
    assert blind.seen == reading.seen == list(range(8))


class _Processors:
    def __init__(self, instances: dict[str, BanUntil]) -> None:
        self.instances = instances

    @tk.hookimpl
    def transformer_kit_components(self):
        return [tk.Component("logits_processor", key, lambda p=p: p) for key, p in self.instances.items()]
