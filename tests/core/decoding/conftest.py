"""A small decoder model and its export, shared by the decoding tests."""

from __future__ import annotations

import pytest
import torch

import transformer_kit as tk
from transformer_kit.export import export_onnx
from transformer_kit.runtime import OnnxModel

VOCAB = 40


def small_decoder(**overrides):
    torch.manual_seed(0)
    config = {"architecture": "decoder", "vocab_size": VOCAB, "d_model": 32, "num_heads": 4,
              "num_layers": 2, "d_ff": 64, "positional": "rotary", "norm": "rmsnorm",
              "block": "pre_norm", "pad_id": 0, "bos_id": 1, "eos_id": 2, "max_len": 64, "dropout": 0.2,
              **overrides}
    model = tk.build_model(config).eval()
    with torch.no_grad():  # a wider spread than the default init, so distributions are peaked
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(std=0.3)
    return model


@pytest.fixture(scope="session")
def runtimes(tmp_path_factory):
    """(PyTorch model, its OnnxModel), exported once per test process."""
    model = small_decoder()
    folder = tmp_path_factory.mktemp("decoder")
    export_onnx(model, folder)
    return model, OnnxModel(folder, providers="cpu")


@pytest.fixture
def prompts():
    """(3, 6) prompts with left and right padding (pad id 0)."""
    ids = torch.randint(3, VOCAB, (3, 6), generator=torch.Generator().manual_seed(3))
    ids[1, 4:] = 0
    ids[2, :2] = 0
    return ids
