"""Shared by the serving tests: the tiny decoder's export in onnxruntime."""

from __future__ import annotations

import pytest

from transformer_kit.runtime import Engine, OnnxModel


@pytest.fixture(scope="session")
def onnx_model(exported) -> OnnxModel:
    _, folder = exported
    return OnnxModel(folder / "onnx", providers="cpu")


@pytest.fixture(scope="session")
def padded_model(exported) -> OnnxModel:
    """The same export without batch invariance: waiting prompts left-padded into one run."""
    _, folder = exported
    return OnnxModel(folder / "onnx", providers="cpu", batch_invariant=False)



def record_prompts(engine: Engine) -> list[list[int]]:
    """The prompts ``engine`` is given from now on, in order (its ``submit`` wrapped)."""
    prompts: list[list[int]] = []
    submit = engine.submit

    def recording(ids, **options):
        prompts.append(list(ids))
        return submit(ids, **options)

    engine.submit = recording
    return prompts
