"""Exporting small models: this checkout's export against another checkout's (an earlier commit,
e.g. the last one that traced its graphs with ``torch.onnx.export``), each in a process of its own.

Two models, random weights, exported without verification by ``transformer-kit export CONFIG
-o OUT --no-verify``: the demo's encoder-decoder (``transformer_kit/apps/demo.yaml``, 234,304
parameters) and a 4-layer decoder (Llama-style components, 0.9M parameters). Each runner is a
process of its own (the baseline's with ``PYTHONPATH`` at the other checkout, the same
interpreter and packages), in interleaved rounds; printed are the medians of the export's own
seconds (its report) and of the whole process's (imports included), and their ratios.

    git worktree add /tmp/kit-before <commit>
    python benchmarks/export_small.py --baseline /tmp/kit-before [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
DECODER = {"architecture": "decoder", "vocab_size": 2000, "d_model": 128, "num_heads": 4,
           "num_kv_heads": 2, "num_layers": 4, "d_ff": 352, "dropout": 0.0, "max_len": 512,
           "attention": "sdpa", "positional": "rotary", "block": "pre_norm",
           "feedforward": "swiglu", "norm": "rmsnorm", "tie_embeddings": True,
           "scale_embeddings": False}


def configs(folder: Path) -> dict[str, Path]:
    """The two configs as files: the demo's and the decoder's."""
    demo = folder / "demo.yaml"
    shutil.copy(ROOT / "transformer_kit" / "apps" / "demo.yaml", demo)
    decoder = folder / "decoder.yaml"
    decoder.write_text(yaml.safe_dump(DECODER))
    return {"demo encoder-decoder": demo, "4-layer decoder": decoder}


def export_once(config: Path, out: Path, source: Path | None) -> tuple[float, float]:
    """(the report's export seconds, the process's wall seconds) of one export."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    if source is not None:
        env["PYTHONPATH"] = str(source)
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "transformer_kit", "export", str(config), "-o", str(out),
                             "--no-verify"], capture_output=True, text=True, env=env, cwd=out.parent)
    wall = time.perf_counter() - start
    if result.returncode != 0:
        raise RuntimeError(f"export of {config.name} failed:\n{result.stderr[-3000:]}")
    seconds = re.search(r"export ([0-9.]+) s", result.stdout)
    return float(seconds.group(1)), wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, required=True,
                        help="a checkout of the kit to compare with (its transformer_kit package)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="export-small-"))
    runners = {"this checkout": None, "baseline": args.baseline.resolve()}
    times: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for round_ in range(args.rounds):
        for model, config in configs(work).items():
            order = list(runners.items()) if round_ % 2 == 0 else list(runners.items())[::-1]
            for runner, source in order:
                times.setdefault((model, runner), []).append(
                    export_once(config, work / f"out-{runner.replace(' ', '-')}", source))
    print(f"{'model':22s} {'runner':14s} {'export s':>9s} {'process s':>10s}")
    for model in configs(work):
        for runner in runners:
            exported = statistics.median(t[0] for t in times[model, runner])
            process = statistics.median(t[1] for t in times[model, runner])
            print(f"{model:22s} {runner:14s} {exported:9.2f} {process:10.2f}")
        ratios = [a[0] / b[0] for a, b in zip(times[model, "this checkout"], times[model, "baseline"],
                                              strict=True)]
        walls = [a[1] / b[1] for a, b in zip(times[model, "this checkout"], times[model, "baseline"],
                                             strict=True)]
        print(f"{model:22s} {'ratio':14s} {statistics.median(ratios):9.3f} {statistics.median(walls):10.3f}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
