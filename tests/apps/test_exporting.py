"""The export a serving command makes of a checkpoint: made once into the kit's cache, reused
while its files, options and the kit are the same, made again when a file changes; an export is
taken as it is; what is no model is refused with a sentence."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from transformer_kit.apps.exporting import cache_root, export_folder
from transformer_kit.core.errors import ArtifactError
from transformer_kit.runtime import OnnxModel


def test_a_saved_model_is_exported_once_and_again_when_it_changes(exported, tmp_path, monkeypatch):
    model, folder = exported
    monkeypatch.setenv("TRANSFORMER_KIT_CACHE", str(tmp_path / "kit"))
    made = []
    first = export_folder(folder / "model", on_export=made.append)
    assert made == [first] and first.parent == cache_root() / "exports"
    ids = np.array([[3, 4, 5, 6]])
    with torch.no_grad():
        expected = model(torch.from_numpy(ids)).numpy()
    np.testing.assert_allclose(OnnxModel(first)(ids), expected, rtol=1e-4, atol=1e-5)
    assert export_folder(folder / "model", on_export=made.append) == first and made == [first]
    int8 = export_folder(folder / "model", quantize="int8", on_export=made.append)
    assert int8 != first and made == [first, int8]
    config = folder / "model" / "config.json"
    stat = config.stat()
    os.utime(config, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # the folder changed
    try:
        assert export_folder(folder / "model", on_export=made.append) not in (first, int8)
    finally:
        os.utime(config, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert len(made) == 3


def test_an_export_is_taken_as_it_is_and_other_things_are_refused(exported, tmp_path):
    _, folder = exported
    assert export_folder(folder / "onnx") == folder / "onnx"
    with pytest.raises(ArtifactError, match="is an export folder, already made; --quantize"):
        export_folder(folder / "onnx", quantize="int4")
    with pytest.raises(ArtifactError, match="is neither an export nor a checkpoint; give an export"):
        export_folder(folder)
    (tmp_path / "model.yaml").write_text("architecture: decoder\n")
    with pytest.raises(ArtifactError, match=r"is a config file \(random weights\)"):
        export_folder(tmp_path / "model.yaml")
