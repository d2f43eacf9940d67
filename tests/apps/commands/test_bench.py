"""transformer-kit bench: both runtimes timed in the same rounds (times printed, not asserted)."""

from __future__ import annotations

from tests.apps.conftest import cli, config_file, invoke


def test_bench_reports_both_runtimes(exported):
    _, folder = exported
    result = invoke("bench", str(folder / "model"), "--new-tokens", "4", "--prompt-len", "4",
                    "--rounds", "1", "-o", str(folder / "onnx"))
    assert result.exit_code == 0, result.output
    assert "transformer-kit, PyTorch eager" in result.output
    assert "transformer-kit, onnxruntime (CPU)" in result.output
    assert "1.00x" in result.output  # the baseline row
    assert "share of bandwidth bound" in result.output and "GB/s" in result.output


def test_bench_refuses_an_encoder(tmp_path):
    path = config_file(tmp_path, architecture="encoder", mask="none")
    result = invoke("bench", str(path), "--rounds", "1")
    assert result.exit_code == 1 and "encoder-only" in result.output


def test_bench_in_a_real_process(tmp_path, exported):
    _, folder = exported
    result = cli("bench", str(folder / "model"), "--new-tokens", "2", "--prompt-len", "3", "--rounds", "1",
                 "-o", str(folder / "onnx"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "vs PyTorch eager" in result.stdout
