"""Shared by the mixture-of-experts family tests: a random checkpoint written by transformers,
loaded with ``tk.from_hf``, gives transformers' logits in PyTorch on a padded batch and its
greedy tokens; its export is refused until the fused onnxruntime form exists."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import numpy as np
import pytest
import torch
import transformers as hf

import transformer_kit as tk
from tests.plugins.families import parity
from transformer_kit.export import export_onnx


def check_greedy_tokens(reference, model) -> None:
    """Greedy generation in PyTorch equals transformers' ``generate`` on a padded batch."""
    cfg = model.config
    ids, mask = parity.batch(model, size=3, length=6, seed=3)
    gen = hf.GenerationConfig(do_sample=False, max_new_tokens=12, pad_token_id=cfg.pad_id,
                              eos_token_id=cfg.eos_id, bos_token_id=cfg.bos_id)
    order = torch.argsort(mask, dim=1, stable=True)  # transformers wants left padding
    with torch.no_grad():
        out = reference.generate(input_ids=ids.gather(1, order), attention_mask=mask.gather(1, order),
                                 generation_config=gen)
    expected = parity.after_eos(out[:, ids.shape[1]:].numpy(), cfg.eos_ids, cfg.pad_id)
    ours = model.generate(ids, max_new_tokens=12, attention_mask=mask).numpy()
    np.testing.assert_array_equal(ours[:, :expected.shape[1]], expected)
    assert (ours[:, expected.shape[1]:] == cfg.pad_id).all()  # transformers stops sooner
    assert expected.shape[1] >= 3 and len(np.unique(expected)) >= 2, expected  # not one repeated token


class MoeFamilyParity:
    """The tests every mixture-of-experts family passes (``CHECKPOINTS`` as in
    ``parity.FamilyParity``; ``conftest.py`` parametrizes ``checkpoint``)."""

    CHECKPOINTS: ClassVar[dict[str, Callable[[], torch.nn.Module]]] = {}

    def test_logits_equal_transformers_in_pytorch(self, checkpoint):
        reference, model, _ = checkpoint
        parity.check_pytorch(reference, model)

    def test_greedy_tokens_equal_transformers_generate(self, checkpoint):
        reference, model, _ = checkpoint
        check_greedy_tokens(reference, model)

    def test_config_and_weights_survive_save_and_load(self, checkpoint, tmp_path):
        reference, model, folder = checkpoint
        parity.check_save_and_load(reference, model, folder, tmp_path / "saved")

    def test_export_is_refused_naming_the_component(self, checkpoint, tmp_path):
        _, model, _ = checkpoint
        with pytest.raises(tk.ExportError, match="feedforward 'moe'"):
            export_onnx(model, tmp_path / "onnx")
