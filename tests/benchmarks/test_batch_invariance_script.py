"""The batch-invariance benchmark runs end to end, small: four exports of a random decoder, a
few prompts alone and in one batch with batch invariance and without, then its cost tables.
With batch invariance (the default) every prompt gets the same greedy tokens alone and in the
batch, and rows of one length the same logits; times are printed, never asserted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent.parent


def test_the_batch_invariance_benchmark_agrees_alone_and_in_a_batch():
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "batch_invariance.py"), "--prompts", "4",
         "--new-tokens", "6", "--rounds", "1", "--cost-rounds", "1"],
        capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = result.stdout.splitlines()
    rows = {line.split(" | ")[0].strip("| "): line.strip("| ").split(" | ")
            for line in lines if line.startswith("| ")}
    for kind in ("float32", "int8", "int4 (level 4)", "int4 (level 1)"):
        assert rows[kind][1] == "4/4" and rows[kind][3] == "0", rows[kind]
    costs = [name for name in rows if name.startswith(("int4: ", "int4 level 1: "))]
    assert len(costs) == 4 and all(float(rows[name][3]) > 0 for name in costs), lines
    assert {"1", "16", "256"} <= set(rows), lines  # the int8 product's cost per row count
