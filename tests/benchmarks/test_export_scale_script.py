"""The export-at-scale benchmark runs end to end on the 100M-parameter shape, the kit's runner
only (onnxruntime-genai's builder is a benchmark extra): figures printed, never asserted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent.parent


def test_export_scale_benchmark_measures_the_kits_export(tmp_path):
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "export_scale.py"), "--shape", "llama-100m",
         "--workdir", str(tmp_path), "--skip", "kit int4 verified", "genai int4",
         "kit float32 --no-verify", "genai fp32"],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "llama-100m: bfloat16 checkpoint 0.20 GB" in result.stdout
    row = next(line for line in result.stdout.splitlines() if line.startswith("kit int4 --no-verify"))
    assert "GB peak" in row and " MB" in row
