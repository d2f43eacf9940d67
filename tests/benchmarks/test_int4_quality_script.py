"""The int4 quality benchmark runs end to end on a tiny random Llama: float32, the old int4 and
the default exported, their perplexity, top-1 and greedy agreement with float32, folder size and
tokens/s (each runner in a process of its own) in one table. Times are printed, never asserted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent.parent


def test_int4_quality_benchmark_prints_one_row_per_variant(tmp_path):
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "int4_quality.py"), "--small", "--few", "--rounds", "1",
         "--tokens", "200", "--window", "64", "--new-tokens", "8", "--workdir", str(tmp_path)],
        capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| weights | perplexity"))
    table = [line for line in lines[start:] if line.startswith("|")]
    header, rows = table[0], table[2:]
    assert header.count("|") == 10 and all(row.count("|") == 10 for row in rows)
    names = [row.split(" | ")[0].lstrip("| ") for row in rows]
    assert names[0] == "float32" and sum(name.endswith("(the default)") for name in names) == 1
    assert len(rows) in (3, 4)  # the three, and onnxruntime-genai's int4 where it is installed
    cells = {name: row.strip("| ").split(" | ") for name, row in zip(names, rows, strict=True)}
    assert cells["float32"][2] == "1.000x" and cells["float32"][6] == "1.00x"
    assert cells["float32"][3] == "100.0%" and cells["float32"][4] == "8/8/8/8"
    for name, row in cells.items():
        if name.startswith("int4"):
            assert float(row[1]) > 0 and 0 <= float(row[3].rstrip("%")) <= 100
            assert float(row[6].rstrip("x")) < 0.6 and float(row[7]) > 0  # a folder, a speed
    assert (tmp_path / "int4-quality.json").is_file()
