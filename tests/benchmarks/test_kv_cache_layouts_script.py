"""The cache-layout benchmark runs end to end: the three layouts (a new present each step, a
buffer written in place by TensorScatter, GroupQueryAttention's shared buffer) compute the same
attention outputs as the concatenating one. Times are printed, never asserted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent.parent


def test_every_cache_layout_gives_the_concatenating_layouts_outputs():
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "kv_cache_layouts.py"), "--layers", "2", "--steps", "6",
         "--lengths", "3", "40"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line.strip("| ").split(" | ") for line in result.stdout.splitlines()[2:] if line.startswith("|")]
    assert [int(row[0]) for row in rows] == [3, 40]
    for row in rows:
        assert all(float(ms) > 0 for ms in row[1:4])
        assert float(row[6]) < 1e-4  # in-place buffers attend over the same keys as concatenation
