"""The prefix cache benchmark runs end to end on a tiny model (one round): its table has a row
per case and the two servers' greedy tokens are equal. Times are printed, never asserted."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent.parent


def test_prefix_cache_benchmark_compares_both_servers(tmp_path):
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "prefix_cache.py"), "--small", "--rounds", "1",
         "--concurrent", "2", "--new-tokens", "4", "--workdir", str(tmp_path)],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    rows = [line.split("|")[1:-1] for line in result.stdout.splitlines()
            if line.startswith("| ") and "---" not in line]
    assert [row[0].strip() for row in rows[1:]] == ["one request alone", "2 requests at once"]
    assert all(re.fullmatch(r" \d+\.\d\dx ", row[3]) for row in rows[1:])
    assert [row[4].strip() for row in rows[1:]] == ["1/1", "2/2"]  # the same greedy tokens
    cached = re.search(r"cached tokens in a reply's usage: (\d+) with the cache, 0 without", result.stdout)
    # the shared prefix's whole 16-token chunks (batch invariance, the default), at least
    assert cached is not None and int(cached.group(1)) >= 500 - 500 % 16
