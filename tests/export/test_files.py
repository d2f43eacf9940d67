"""An export folder is a folder the user wrote: its modes follow the umask, like any other."""

from __future__ import annotations

import os
import stat

import pytest
import torch

import transformer_kit as tk
from tests.combinations import tiny_config
from transformer_kit.export import export_onnx
from transformer_kit.runtime import OnnxModel


@pytest.mark.skipif(os.name != "posix", reason="file modes and umask are POSIX")
@pytest.mark.parametrize(("umask", "folder_mode", "file_mode"), [(0o022, 0o755, 0o644), (0o077, 0o700, 0o600),
                                                                 (0o002, 0o775, 0o664)])
def test_export_modes_follow_the_umask(tmp_path, umask, folder_mode, file_mode):
    torch.manual_seed(0)
    model = tk.build_model(tiny_config("encoder", d_model=8, num_heads=2))
    previous = os.umask(umask)
    try:
        export_onnx(model, tmp_path / "onnx")
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "onnx").stat().st_mode) == folder_mode
    files = list((tmp_path / "onnx").iterdir())
    assert {p.name for p in files} == {"manifest.json", "model.onnx", "weights.data"}
    assert {stat.S_IMODE(p.stat().st_mode) for p in files} == {file_mode}
    assert OnnxModel(tmp_path / "onnx").manifest.architecture == "encoder"
