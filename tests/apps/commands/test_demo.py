"""transformer-kit demo: the main job solves the reversal task in both runtimes."""

from __future__ import annotations

import re

from tests.apps.conftest import cli


def test_demo_solves_the_task(tmp_path):
    result = cli("demo", "-o", str(tmp_path / "demo"), cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    line = next(li for li in result.stdout.splitlines() if "accuracy on 500 unseen" in li)
    accuracies = [float(x.rstrip("%,;")) for x in line.replace("%", "% ").split() if x[0].isdigit()]
    assert accuracies[1] >= 99.0 and accuracies[2] >= 99.0
    assert (tmp_path / "demo" / "onnx" / "manifest.json").exists()
    assert (tmp_path / "demo" / "model" / "model.safetensors").exists()
    # 4-bit weights on the trained model: at least 99 % of float32's greedy tokens
    int4 = re.search(r"int4 weights:\s+([\d.]+)%\s+of\s+float32's\s+greedy", result.stdout)
    assert int4 and float(int4.group(1)) >= 99.0
    assert (tmp_path / "demo" / "onnx-int4" / "manifest.json").exists()
