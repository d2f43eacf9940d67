"""Shared by the serving tests: the tiny decoder's export in onnxruntime."""

from __future__ import annotations

import pytest

from transformer_kit.runtime import Engine, OnnxModel


@pytest.fixture(scope="session")
def onnx_model(exported) -> OnnxModel:
    _, folder = exported
    return OnnxModel(folder / "onnx", providers="cpu")


@pytest.fixture(scope="session")
def shared_model(tmp_path_factory) -> OnnxModel:
    """A tiny decoder whose heads are 8 wide: its export has the step graph over a cache buffer
    shared by past and present, the default layout on the CPU."""
    import torch

    import transformer_kit as tk
    from tests.combinations import tiny_config
    from transformer_kit.export import export_onnx

    torch.manual_seed(0)
    model = tk.build_model(tiny_config("decoder", attention="sdpa", d_model=32, d_ff=48, max_len=256))
    folder = export_onnx(model, tmp_path_factory.mktemp("shared") / "onnx").path
    om = OnnxModel(folder, providers="cpu")
    assert om.step_name == "decoder_step_shared"
    return om


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
