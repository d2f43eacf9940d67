"""Verification's reference keeps what it reads up to its budget, and reads the rest each time."""

from __future__ import annotations

import torch

from transformer_kit.export.kept_weights import KeptWeights


class CountingSource:
    def __init__(self) -> None:
        self.reads: list[str] = []
        self.tensors = {"a": torch.ones(10), "b": torch.full((20,), 2.0), "c": torch.zeros(5)}

    def load(self, name: str) -> torch.Tensor:
        self.reads.append(name)
        return self.tensors[name].clone()


def test_weights_are_kept_up_to_the_budget_and_read_again_beyond_it():
    source = CountingSource()
    kept = KeptWeights(source, budget=4 * 15)  # a (40 bytes) fits; b (80) does not; c (20) does
    for _ in range(3):
        for name in ("a", "b", "c"):
            assert torch.equal(kept.load(name), source.tensors[name])
    assert source.reads == ["a", "b", "c", "b", "b"]
    assert kept.kept_bytes == 60 and set(kept.kept) == {"a", "c"}


def test_no_budget_keeps_nothing():
    source = CountingSource()
    kept = KeptWeights(source, budget=-5)
    kept.load("a")
    kept.load("a")
    assert source.reads == ["a", "a"] and kept.kept == {}
