"""transformer-kit demo: the main job solves the reversal task in both runtimes.

CI runs the demo as its main job before the tests (``.ci/run``) and names that run's folder in
``TK_DEMO_RUN`` (its output in ``<folder>.log``): the test then checks that run rather than
training the model a second time (80 s of the suite). Without it, the test runs the demo."""

from __future__ import annotations

import os
import re
from pathlib import Path

from tests.apps.conftest import cli


def demo_run(tmp_path: Path) -> tuple[Path, str]:
    """The demo's output folder and what it printed: CI's run, or one run here."""
    given = os.environ.get("TK_DEMO_RUN")
    if given:
        return Path(given), Path(f"{given}.log").read_text(encoding="utf-8")
    result = cli("demo", "-o", str(tmp_path / "demo"), cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return tmp_path / "demo", result.stdout


def test_demo_solves_the_task(tmp_path):
    folder, stdout = demo_run(tmp_path)
    line = next(li for li in stdout.splitlines() if "accuracy on 500 unseen" in li)
    accuracies = [float(x.rstrip("%,;")) for x in line.replace("%", "% ").split() if x[0].isdigit()]
    assert accuracies[1] >= 99.0 and accuracies[2] >= 99.0
    assert (folder / "onnx" / "manifest.json").exists()
    assert (folder / "model" / "model.safetensors").exists()
    # 4-bit weights on the trained model: at least 99 % of float32's greedy tokens
    int4 = re.search(r"int4 weights:\s+([\d.]+)%\s+of\s+float32's\s+greedy", stdout)
    assert int4 and float(int4.group(1)) >= 99.0
    assert (folder / "onnx-int4" / "manifest.json").exists()
