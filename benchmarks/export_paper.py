"""Time the export of the paper-size encoder-decoder (d_model 512, 8 heads, 6+6 layers, d_ff 2048).

    python benchmarks/export_paper.py [--dtype float16] [--out DIR]

Prints the export report (graph sizes, verification errors, export and verification seconds)
and the wall time of the whole call. The baseline in the same run is PyTorch's own forward
time on the verification shape, so the export time can be read against the model's cost.
"""

from __future__ import annotations

import argparse
import platform
import tempfile
import time
from pathlib import Path

import torch

import transformer_kit as tk
from transformer_kit.export import export_onnx

PAPER = Path(tk.__file__).parent / "configs" / "paper.yaml"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16"])
    parser.add_argument("--out", default=None, help="export folder (default: a temporary one)")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = tk.build_model(PAPER).eval()
    src = torch.randint(3, model.config.src_vocab, (3, 7))
    tgt = torch.randint(3, model.config.tgt_vocab, (3, 5))
    with torch.no_grad():
        model(src, tgt)
        start = time.perf_counter()
        model(src, tgt)
        forward = time.perf_counter() - start
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp()) / "paper-onnx"
    start = time.perf_counter()
    report = export_onnx(model, out, dtype=args.dtype)
    wall = time.perf_counter() - start
    print(report)
    print(f"machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads")
    print(f"PyTorch forward 3x7 -> 3x5: {forward * 1e3:.1f} ms (baseline, same run)")
    print(f"export_onnx wall time: {wall:.1f} s")


if __name__ == "__main__":
    main()
