"""The gpt-oss-at-scale benchmark runs end to end on the tiny shape, the kit's steps only
(onnxruntime-genai's builder lives in a venv of its own): figures recorded, never asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent.parent


def test_gpt_oss_scale_benchmark_measures_the_kits_export_and_run(tmp_path):
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpt_oss_scale.py"), "--write", "tiny",
         "--workdir", str(tmp_path), "--skip", "genai", "--new-tokens", "8", "--prompt", "5"],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads((tmp_path / "gpt_oss_scale.json").read_text())
    export, run = report["steps"]["kit export"], report["steps"]["kit run"]
    assert export["ok"] and export["peak_rss"] > 0 and export["folder_bytes"] > 0, export
    assert run["ok"] and run["new_tokens"] == 8 and run["tokens_per_second"] > 0, run
    assert "| kit run | ok |" in (tmp_path / "gpt_oss_scale.md").read_text()
