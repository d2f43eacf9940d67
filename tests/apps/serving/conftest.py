"""Shared by the serving tests: the tiny decoder's export in onnxruntime."""

from __future__ import annotations

import pytest

from transformer_kit.export import OnnxModel


@pytest.fixture(scope="session")
def onnx_model(exported) -> OnnxModel:
    _, folder = exported
    return OnnxModel(folder / "onnx", providers="cpu")


