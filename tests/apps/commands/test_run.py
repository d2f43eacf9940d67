"""transformer-kit run: the exported forward graph, checked against PyTorch."""

from __future__ import annotations

import torch

from tests.apps.conftest import cli, invoke


def test_run_prints_pytorch_s_top_tokens(exported):
    model, folder = exported
    result = invoke("run", str(folder / "onnx"), "--ids", "5 6 7; 8 9")
    assert result.exit_code == 0, result.output
    assert "provider: CPUExecutionProvider" in result.output and "shape [2, 3, 37]" in result.output
    with torch.no_grad():
        expected = model(torch.tensor([[5, 6, 7], [8, 9, 0]])).argmax(-1).tolist()
    assert f"argmax: {expected}" in result.output


def test_run_names_what_it_was_given_instead_of_an_export(exported, tmp_path):
    _, folder = exported
    result = invoke("run", str(folder / "model"), "--ids", "5 6")
    assert result.exit_code == 1
    assert "is a saved PyTorch model folder" in result.output and "transformer-kit export" in result.output
    result = invoke("run", str(tmp_path / "missing"), "--ids", "5 6")
    assert result.exit_code == 1 and "does not exist" in result.output


def test_provider_errors_use_the_flag(exported):
    _, folder = exported
    from transformer_kit.runtime.providers import cuda_works

    result = invoke("run", str(folder / "onnx"), "--ids", "5 6", "--provider", "tpu")
    assert result.exit_code == 2 and "--provider" in result.output
    if not cuda_works():
        result = invoke("run", str(folder / "onnx"), "--ids", "5 6", "--provider", "cuda")
        assert result.exit_code == 1 and "--provider cuda" in result.output
        assert "providers=" not in result.output


def test_run_in_a_real_process(tmp_path, exported):
    _, folder = exported
    result = cli("run", str(folder / "onnx"), "--ids", "5 6 7", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "argmax" in result.stdout
    failed = cli("run", str(tmp_path / "missing"), "--ids", "1", cwd=tmp_path)
    assert failed.returncode == 1 and "Traceback" not in failed.stderr
    assert "does not exist" in failed.stderr
