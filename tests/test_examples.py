"""The examples README documents run as written (scaled down where they take a flag for it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).parent.parent / "examples"


def test_gpt2_checkpoint_to_onnx_example(tmp_path):
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "gpt2_checkpoint_to_onnx.py"), "--workdir", str(tmp_path),
         "--layers", "1", "--max-new-tokens", "6"],
        capture_output=True, text=True, timeout=600, check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [line for line in result.stdout.splitlines() if "onnxruntime == transformers" in line]
    assert rows == [f"   row {i}: onnxruntime == transformers: True; PyTorch kit == transformers: True"
                    for i in range(2)]
    assert (tmp_path / "onnx" / "manifest.json").exists()
