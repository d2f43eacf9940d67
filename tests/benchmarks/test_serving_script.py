"""The serving load benchmark runs end to end on a tiny model (short levels, a few hundred
requests for the memory line). Times are printed, never asserted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent.parent


def test_serving_benchmark_runs_every_level(tmp_path):
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "serving.py"), "--small", "--clients", "1", "4",
         "--requests", "8", "--new-tokens", "4", "--memory-requests", "200", "--workdir", str(tmp_path)],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-6000:]
    rows = [line for line in result.stdout.splitlines() if line.startswith("| ") and "---" not in line]
    assert [row.split("|")[1].strip() for row in rows[1:]] == ["1", "4"]
    assert rows[1].split("|")[3].strip() == "1.00x"  # one client is the baseline
    assert "server RSS over 200 requests" in result.stdout
    assert "the prefix cache held" in result.stdout
