"""The shared buffer's memory is what it counts: its cache tensors are views of one allocation,
a prefix entry holds only its row's columns (not the prefill's other rows), and the logits of
every batch size are views of one store (tests/runtime/test_batch_invariance.py checks the tokens)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import transformer_kit as tk
from tests.combinations import tiny_config
from transformer_kit.export import export_onnx
from transformer_kit.runtime import OnnxModel
from transformer_kit.runtime.shared_buffer import SharedBuffer


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> OnnxModel:
    torch.manual_seed(0)
    built = tk.build_model(tiny_config("decoder", vocab_size=64, d_model=64, num_layers=2, max_len=96,
                                       positional="rotary", attention="sdpa")).eval()
    return OnnxModel(export_onnx(built, tmp_path_factory.mktemp("shared") / "onnx").path,
                     providers="cpu", cache_layout="shared_buffer")


def _block(array: np.ndarray) -> np.ndarray:
    """The allocation a view reads."""
    while array.base is not None:
        array = array.base
    return array


def test_the_cache_tensors_are_views_of_one_allocation_of_the_counted_bytes(model):
    batch = model.batch_decoder()
    assert isinstance(batch, SharedBuffer)
    rng = np.random.default_rng(0)
    prefilled, _ = batch.prefill([rng.integers(1, 64, 5) for _ in range(3)])
    batch.join(prefilled)
    batch.step(np.array([3, 4, 5], np.int64))
    blocks = {id(_block(b)) for b in batch.buffers}
    assert len(blocks) == 1
    assert _block(batch.buffers[0]).nbytes == batch.nbytes


def test_a_prefix_entry_holds_its_own_row_only(model):
    batch = model.batch_decoder()
    rng = np.random.default_rng(1)
    prompts = [rng.integers(1, 64, 6) for _ in range(3)]
    prefilled, _ = batch.prefill(prompts)
    entry, counted = batch.prefix_entry(prefilled, 1)
    assert sum(_block(b).nbytes for b in {id(_block(b)): b for b in entry.buffers}.values()) == counted
    for mine, theirs in zip(entry.buffers, prefilled.buffers, strict=True):
        assert not np.shares_memory(mine, theirs)
        np.testing.assert_array_equal(mine[0], theirs[1, :, :6])


def test_the_logits_of_every_batch_size_are_views_of_one_store(model):
    batch = model.batch_decoder()
    big = batch.logits_buffer(8)
    assert batch.logits_buffer(8) is big  # the binding's output stays bound while the shape stays
    small = batch.logits_buffer(3)
    assert small.shape == (3, model.manifest.tgt_vocab) and np.shares_memory(small, big)
    assert batch.logits_buffer(2, 4).shape == (8, model.manifest.tgt_vocab)

