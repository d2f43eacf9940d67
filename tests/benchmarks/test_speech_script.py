"""The speech benchmark runs end to end on tiny.en's real weights (one round, two of the kit's
runners, two clips, a long file of them joined and two files served at once): its table has a row
per workload and every runner's word error rate is reported. Times are printed, never asserted."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import skip_without_speech_data

ROOT = Path(__file__).parent.parent.parent


def test_speech_benchmark_reports_each_workload(tmp_path):
    skip_without_speech_data()
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "speech.py"), "--rounds", "1", "--clips", "2",
         "--long-seconds", "20", "--files", "2", "--runners", "kit float32", "kit int4",
         "--workdir", str(tmp_path)],
        capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    rows = [line.split("|")[1:-1] for line in result.stdout.splitlines()
            if line.startswith("| ") and "---" not in line]
    assert [row[0].strip() for row in rows[1:]] == ["0870", "0880", "20 s file", "2 files"]
    assert all(re.fullmatch(r" \d+\.\dx ", cell) for row in rows[1:] for cell in row[2:])
    for runner in ("kit float32", "kit int4"):
        assert re.search(rf"{runner}: \d+\.\d\d / \d+\.\d\d / \d+\.\d\d, \d+ MiB", result.stdout), runner
