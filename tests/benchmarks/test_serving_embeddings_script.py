"""The embeddings serving benchmark runs end to end on the tiny shape (two levels, a short
memory line). Times are printed, never asserted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent.parent


def test_serving_embeddings_benchmark_runs_every_level(tmp_path):
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "serving_embeddings.py"), "--small", "--clients", "1", "8",
         "--requests", "16", "--inputs", "2", "--memory-requests", "40", "--workdir", str(tmp_path)],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [line for line in result.stdout.splitlines() if line.startswith("| ") and "---" not in line]
    assert [row.split("|")[1].strip() for row in rows[1:]] == ["1", "8"]
    assert rows[1].split("|")[3].strip() == "1.00x"  # one client is the baseline
    assert int(rows[2].split("|")[5]) >= 1
    assert "server RSS over 40 requests" in result.stdout
