"""The prompt lookup benchmark runs end to end on a tiny random Llama: both precisions, plain
and prompt lookup runners each in a process of its own, one row per precision and prompt, the
replies of both runners the same in float32. Times are printed, never asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent.parent


def test_speculative_benchmark_prints_one_row_per_precision_and_prompt(tmp_path):
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "speculative.py"), "--small", "--rounds", "1",
         "--new-tokens", "12", "--workdir", str(tmp_path)], capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]  # non-zero when tokens differ
    lines = result.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| precision | prompt"))
    rows = [line for line in lines[start + 2:] if line.startswith("|")]
    assert len(rows) == 2 * (8 + 2) and all(row.count("|") == 13 for row in rows)
    float32 = [row for row in rows if row.startswith("| float32 |") and "geometric" not in row]
    assert len(float32) == 8
    for row in float32:  # prompt lookup's tokens and the assistant's: all plain greedy's
        cells = row.strip("| ").split(" | ")
        assert cells[10] == "all" and cells[11].endswith(", all")
    results = json.loads((tmp_path / "speculative.json").read_text())
    assert len(results) == 16
    for name, row in results.items():
        assert row["same"] == "all" or name.startswith("int4")
        assert row.get("assistant_same", "all") == "all"
        plain, lookup = row["steps"]
        assert 1 <= row["reply"] <= 12 and plain == row["reply"]  # a plain decoder: one step a token
        assert 1 <= lookup <= plain
