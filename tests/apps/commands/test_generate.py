"""transformer-kit generate: greedy tokens in onnxruntime equal PyTorch's."""

from __future__ import annotations

import torch

from tests.apps.conftest import cli, invoke


def test_generate_gives_pytorch_s_tokens(exported):
    model, folder = exported
    result = invoke("generate", str(folder / "onnx"), "--ids", "5 6 7; 8 9", "--max-new-tokens", "5")
    assert result.exit_code == 0, result.output
    tokens = model.generate(torch.tensor([[5, 6, 7], [8, 9, 0]]), max_new_tokens=5).tolist()
    for row in tokens:
        assert " ".join(map(str, row)) in result.output
    negative = invoke("generate", str(folder / "onnx"), "--ids", "5", "--max-new-tokens", "-1")
    assert negative.exit_code == 2 and "--max-new-tokens" in negative.output


def test_generate_in_a_real_process(tmp_path, exported):
    _, folder = exported
    result = cli("generate", str(folder / "onnx"), "--ids", "5 6 7", "--max-new-tokens", "3", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "tokens/s" in result.stdout
