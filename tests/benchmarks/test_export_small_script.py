"""The small-model export benchmark runs end to end, this checkout against itself as the
baseline: a row per model and runner and a ratio row, figures printed, never asserted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent.parent


def test_export_small_benchmark_times_both_checkouts():
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "export_small.py"), "--baseline", str(ROOT),
         "--rounds", "1"], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    for model in ("demo encoder-decoder", "4-layer decoder"):
        for runner in ("this checkout", "baseline", "ratio"):
            assert any(line.startswith(model) and runner in line for line in lines), (model, runner)
