"""The checkpoint-family benchmark runs end to end on a tiny checkpoint: the kit's onnxruntime
and transformers' eager generate timed in the same rounds. Times are printed, never asserted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent.parent


def test_families_benchmark_times_the_kit_and_transformers(tmp_path):
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "families.py"), "--small", "--families", "mistral",
         "--rounds", "1", "--workdir", str(tmp_path)],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "## mistral (tiny)" in result.stdout
    assert "onnxruntime" in result.stdout and "transformers" in result.stdout
