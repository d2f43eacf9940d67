"""The generation benchmark script runs end to end (one short round) and every runtime it
times produces PyTorch's tokens. Times are printed, never asserted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent.parent


def test_generation_benchmark_runs_and_all_runtimes_agree(tmp_path):
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "generation.py"), "--rounds", "1",
         "--prompt-len", "4", "--new-tokens", "4", "--workdir", str(tmp_path)],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [line for line in result.stdout.splitlines() if line.startswith("| ") and "---" not in line]
    names = [row.split("|")[1].strip() for row in rows[1:]]
    assert names[:2] == ["transformer-kit, PyTorch eager", "transformer-kit, onnxruntime (CPU)"]
    assert "matrix products alone (ceiling)" in names
    for row in rows[1:]:
        assert row.rstrip(" |").endswith(("yes", "-")), row  # same tokens as the baseline
