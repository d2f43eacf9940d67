"""The soak runs end to end, briefly: the real SmolLM2 int4 export served to 8 clients mixing
every endpoint for 20 seconds, every answer equal to the one the same request gets alone
(batch-invariant decoding through the server), nothing failed; the plot is written. Times and
memory are printed, never asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent.parent


def test_the_soak_answers_every_request_as_alone(tmp_path):
    plot = tmp_path / "soak.png"
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "soak.py"), "--minutes", "0.34", "--clients", "8",
         "--plot", str(plot), "--workdir", str(tmp_path)],
        capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    record = json.loads((tmp_path / "soak.json").read_text())
    assert record["answered"] == record["sent"] > 50
    assert record["failed"] == [] and record["different"] == []
    assert plot.stat().st_size > 10_000
