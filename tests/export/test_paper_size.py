"""The paper's base model (d_model 512, 8 heads, 6+6 layers, d_ff 2048) exports and matches.

Its export time is measured in benchmarks/export_paper.py, not here."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

import transformer_kit as tk
from transformer_kit.export import export_onnx
from transformer_kit.export.verify import random_ids, relative_error
from transformer_kit.runtime import OnnxModel

PAPER = Path(tk.__file__).parent / "configs" / "paper.yaml"


@torch.no_grad()
def test_paper_model_exports_and_matches(tmp_path):
    torch.manual_seed(0)
    model = tk.build_model(PAPER).eval()
    cfg = model.config
    assert (cfg.d_model, cfg.num_heads, cfg.n_encoder_layers, cfg.n_decoder_layers, cfg.d_ff) == (
        512, 8, 6, 6, 2048)
    report = export_onnx(model, tmp_path / "paper")
    assert report.max_error <= 1e-4
    om = OnnxModel(tmp_path / "paper", providers="cpu")
    src = random_ids(2, 20, cfg.src_vocab, cfg.pad_id, seed=11)
    tgt = random_ids(2, 9, cfg.tgt_vocab, cfg.pad_id, seed=12, pad_rows=False)
    assert relative_error(om(src.numpy(), tgt.numpy()), model(src, tgt).numpy()) <= 1e-4
    np.testing.assert_array_equal(om.generate(src.numpy(), 8), model.generate(src, 8).numpy())
