"""transformer-kit plot positional|attention: PNGs of the right size; bad sizes are refused."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from tests.apps.conftest import cli, invoke


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_plots(tmp_path, exported):
    _, folder = exported
    result = invoke("plot", "positional", "-o", str(tmp_path / "pe.png"))
    assert result.exit_code == 0, result.output
    width, height = png_size(tmp_path / "pe.png")
    assert width > height > 100
    result = invoke("plot", "attention", str(folder / "model"), "--ids", "5 6 7 8",
                    "-o", str(tmp_path / "attn"))
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (tmp_path / "attn").iterdir()) == [
        "decoder_layers_0_self_attention.png", "decoder_layers_1_self_attention.png"]


@pytest.mark.parametrize(("flag", "value"), [("--length", "-5"), ("--length", "0"), ("--d-model", "0")])
def test_sizes_below_one_are_refused_before_drawing(tmp_path, flag, value):
    result = invoke("plot", "positional", "-o", str(tmp_path / "pe.png"), flag, value)
    assert result.exit_code == 2 and flag in result.output and "Traceback" not in result.output
    assert not (tmp_path / "pe.png").exists()


def test_plots_in_a_real_process(tmp_path, exported):
    _, folder = exported
    for args in (["plot", "positional", "-o", str(tmp_path / "pe.png")],
                 ["plot", "attention", str(folder / "model"), "--ids", "5 6", "-o", str(tmp_path / "a")]):
        result = cli(*args, cwd=tmp_path)
        assert result.returncode == 0, (args, result.stderr)
        assert "wrote" in result.stdout
