"""No option can exhaust memory: generation respects the context length, and what it holds
grows with the tokens it really generates, not with ``max_new_tokens``."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
import torch

import transformer_kit as tk
from tests.core.decoding.conftest import small_decoder
from transformer_kit.export import export_onnx
from transformer_kit.runtime import OnnxModel


@pytest.fixture(scope="module")
def unbounded(tmp_path_factory):
    """A model with sinusoidal positions (no position bound) and a 10-million-token context."""
    model = small_decoder(positional="sinusoidal", max_len=10**7, dropout=0.0)
    folder = tmp_path_factory.mktemp("sinusoidal")
    export_onnx(model, folder)
    return model, OnnxModel(folder, providers="cpu")


def test_a_budget_beyond_the_context_is_refused_at_once(unbounded):
    model, onnx_model = unbounded
    ids = np.array([[5, 6, 7]])
    for call in (lambda: onnx_model.generate(ids, 10**9),
                 lambda: model.generate(torch.from_numpy(ids), 10**9),
                 lambda: onnx_model.generate(ids, 10**7 - 2, num_beams=2)):
        with pytest.raises(tk.InputError, match=r"context length is 10000000; .* at most 9999997"):
            call()


def test_memory_grows_with_the_tokens_generated_not_the_budget(unbounded):
    model, onnx_model = unbounded
    ids = np.array([[5, 6, 7], [8, 9, 10]])
    greedy = onnx_model.generate(ids, 6, eos_id=[])
    eos = [int(greedy[0, 3]), int(greedy[1, 4])]  # ids the rows really produce
    tracemalloc.start()
    try:
        tokens = onnx_model.generate(ids, 10**7 - 10, eos_id=eos)  # ~160 MB of mask if preallocated
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert tokens.shape[1] <= 5
    assert np.isin(tokens[:, -1], eos).all() or np.isin(tokens, eos).any(axis=1).all()
    assert peak < 2_000_000, peak  # bytes held by Python/numpy during the call
    np.testing.assert_array_equal(model.generate(torch.from_numpy(ids), 10**7 - 10, eos_id=eos).numpy(),
                                  tokens)
