"""The benchmark against llama.cpp's server runs end to end on a tiny random Qwen2 file (one
round, 1 and 4 clients), where llama-cpp-python and its server extra are installed (CI does
not build it). Times are printed, never asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent.parent


def test_the_benchmark_serves_both_and_reports_each_level(tmp_path):
    pytest.importorskip("llama_cpp.server.app", reason="llama-cpp-python[server] is not installed")
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "serving_llama_cpp.py"), "--files", "qwen2-tiny",
         "--clients", "1", "4", "--rounds", "1", "--requests", "8", "--new-tokens", "8",
         "--workdir", str(tmp_path)],
        capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    levels = json.loads((tmp_path / "serving_llama_cpp.json").read_text())["results"]["qwen2-tiny"]
    assert sorted(levels) == ["1", "4"]
    assert all(level[s]["tokens_per_s"] > 0 for level in levels.values() for s in ("kit", "llama.cpp"))
