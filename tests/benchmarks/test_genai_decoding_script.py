"""The decoding benchmark against onnxruntime-genai runs end to end on a tiny random Llama: the
kit's three exports (and genai's two where it is installed), each also decoded without batch
invariance, each runner in a process of its own, one table row per kit export and one per
export against its not-invariant twin. Times are printed, never asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent.parent


def test_genai_decoding_benchmark_prints_one_row_per_kit_export(tmp_path):
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "genai_decoding.py"), "--small", "--rounds", "2",
         "--workdir", str(tmp_path), "--json", str(tmp_path / "timings.json"), "--left-padded"],
        capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| model | kit's weights"))
    rows = [line.strip("| ").split(" | ") for line in lines[start + 2:start + 5]]
    assert [row[1] for row in rows] == ["int4", "int4, genai's recipe", "float32"]
    assert all(float(row[2]) > 0 for row in rows)
    timings = json.loads((tmp_path / "timings.json").read_text())["tiny"]
    assert timings["new_tokens"] == 32 and timings["prompt"] == 16
    runners = timings["seconds"]
    assert {"kit int4", "kit int4, genai's recipe", "kit float32"} <= set(runners)
    assert {"left-padded int4", "left-padded int4, genai's recipe", "left-padded float32"} <= set(runners)
    start = next(i for i, line in enumerate(lines)
                 if line.startswith("| model | kit's weights | batch invariant"))
    padded = [line.strip("| ").split(" | ") for line in lines[start + 2:start + 5]]
    assert [row[1] for row in padded] == ["int4", "int4, genai's recipe", "float32"]
    assert all(float(row[2]) > 0 and float(row[3]) > 0 for row in padded)
    assert all(len(seconds) == 2 and min(seconds) > 0 for seconds in runners.values())
    if "genai float32" in runners:  # onnxruntime-genai installed: float32 greedy tokens agree
        assert timings["agree"]["float32"] and rows[2][5] == "yes"
