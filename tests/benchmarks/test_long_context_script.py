"""The long-context benchmark against onnxruntime-genai runs end to end on a tiny random Llama:
prompts of 32 and 64 tokens of its text, each runner (the kit's int4 and float32, and genai's
where this interpreter has it) in a process of its own, with the time to the first token and
the decoding speed after it. Times are printed, never asserted."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent.parent
TEXT = Path("/usr/share/common-licenses/GPL-3")  # the benchmark's prompt text (Debian's base-files)


def test_long_context_benchmark_reports_both_figures_for_each_length(tmp_path):
    if not TEXT.is_file():
        pytest.skip(f"{TEXT}, the benchmark's prompt text, is not on this machine")
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "long_context.py"), "--small", "--rounds", "2",
         "--workdir", str(tmp_path), "--json", str(tmp_path / "figures.json")],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    lengths = json.loads((tmp_path / "figures.json").read_text())["results"]["tiny"]
    assert sorted(lengths, key=int) == ["32", "64"]
    for length, figures in lengths.items():
        assert figures["prompt"] == int(length) and figures["new_tokens"] == 64
        runners = figures["summary"]["runners"]
        assert {"kit int4", "kit float32"} <= set(runners)
        for runner, summary in runners.items():
            assert len(figures["runs"][runner]) == 2
            assert len(figures["tokens"][runner]) == 64
            for key in ("ttft_s", "decode_tokens_per_s"):
                assert math.isfinite(summary[key]) and summary[key] > 0, (length, runner, key)
        for ratios in figures["summary"]["ratios"].values():  # genai's rows, where it is installed
            assert ratios["decode"] > 0 and ratios["ttft"] > 0
    rows = [line.strip("| ").split(" | ") for line in result.stdout.splitlines()
            if line.startswith("| a tiny random Llama")]
    assert [(row[1], row[2]) for row in rows] == [("int4", "32"), ("float32", "32"), ("int4", "64"),
                                                  ("float32", "64")]
    assert all(float(row[3]) > 0 and float(row[6]) > 0 for row in rows)
