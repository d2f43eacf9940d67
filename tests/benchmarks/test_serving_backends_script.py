"""The serving-backends benchmark runs end to end on a tiny model: the one-process server and a
real Triton server (the nvidia-pytriton wheel's) take turns under the same load, and the table
has a row per server and level, ``local`` the 1.00x baseline. (Ray Serve's start, 20 s, is left
to tests/apps/serving/test_ray.py.) Times are printed, never asserted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from testbed import triton_local

ROOT = Path(__file__).parent.parent.parent


def test_serving_backends_benchmark_runs_local_and_triton(tmp_path):
    if triton_local.wheel_root() is None:
        pytest.skip("nvidia-pytriton (the wheel with tritonserver) is not installed: pip install "
                    "--no-deps nvidia-pytriton==0.7.0, as .ci/run does.")
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "serving_backends.py"), "--small", "--clients", "1",
         "4", "--requests", "8", "--new-tokens", "4", "--rounds", "1", "--backends", "local", "triton",
         "--workdir", str(tmp_path)],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line.split("|")[1:4] for line in result.stdout.splitlines()
            if line.startswith("| ") and "---" not in line][1:]
    assert [(r[0].strip(), r[1].strip()) for r in rows] == [("local", "1"), ("triton", "1"),
                                                          ("local", "4"), ("triton", "4")]
    assert all(float(r[2]) > 0 for r in rows)
