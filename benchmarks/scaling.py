"""Scaling: time per generated token against context length and batch, and forward time
against sequence length and batch, in onnxruntime with PyTorch eager timed alongside.

Model: the GPT-2-shaped checkpoint of ``generation.py`` (max 1024 positions). A decoding step
is timed at a given cache length by feeding a cache of that length (random keys and values)
to ``decoder_step.onnx``, and to the PyTorch model's ``step``; cached decoding should cost
a + b * length per token (one pass over the weights plus attention over the cache). Writes
``scaling.png`` and prints the tables and the straight-line fit.

    python benchmarks/scaling.py [--workdir bench-work] [--png BENCHMARKS-scaling.png]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # testbed/: helpers the benchmarks share

import transformer_kit as tk
from testbed.peers import gpt2_checkpoint
from transformer_kit.apps.benchmark import exported, median_time, random_prompts
from transformer_kit.core.attention import LayerCache

CACHE_LENGTHS = [64, 128, 256, 512, 1023]  # + 1 new token = 1024 positions, GPT-2's limit
LENGTHS = [64, 128, 256, 512, 1024]
BATCHES = [1, 2, 4, 8, 16]


def _blocks(fns: list, calls: int) -> list[float]:
    """Median seconds of each function over ``calls`` consecutive calls after a warm-up call.

    Calls are grouped per function (not alternated) because onnxruntime's and PyTorch's
    worker threads keep spinning briefly after a call and slow down whatever runs next; the
    warm-up call absorbs that.
    """
    return [median_time(fn, calls) for fn in fns]


def step_timers(model, session, batch: int, past: int):
    cfg = model.config
    rng = np.random.default_rng(past + batch)
    layers = len(model.decoder.layers)
    cache = [rng.standard_normal((batch, cfg.kv_heads, past, cfg.attention_head_dim), dtype=np.float32)
             for _ in range(2 * layers)]
    feeds = {"input_ids": np.full((batch, 1), 5, np.int64),
             "attention_mask": np.ones((batch, past + 1), np.int64)}
    for i in range(layers):
        feeds[f"past_key_values.{i}.key"] = cache[2 * i]
        feeds[f"past_key_values.{i}.value"] = cache[2 * i + 1]
    ids = torch.from_numpy(feeds["input_ids"])
    real = torch.ones(batch, past + 1, dtype=torch.bool)
    tensors = [torch.from_numpy(c) for c in cache]

    def eager():
        caches = [LayerCache(tensors[2 * i], tensors[2 * i + 1]) for i in range(layers)]
        with torch.inference_mode():
            model.step(ids, real, caches, last_only=True)

    return (lambda: session.run(["logits"], feeds)), eager


def forward_timers(model, om, batch: int, length: int):
    cfg = model.config
    ids = random_prompts(cfg.vocab_size, batch, length, {0, cfg.bos_id, *cfg.eos_ids}, seed=length)
    ids_np = ids.numpy()

    def eager():
        with torch.inference_mode():
            model(ids)

    return (lambda: om(ids_np)), eager


def linear_fit(xs: list[int], ys: list[float]) -> tuple[float, float, float]:
    """Least squares y = a + b x; returns a, b and the largest relative residual."""
    b, a = np.polyfit(xs, ys, 1)
    worst = max(abs(a + b * x - y) / y for x, y in zip(xs, ys, strict=True))
    return float(a), float(b), float(worst)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--calls", type=int, default=21, help="calls per step point (forward: a third)")
    parser.add_argument("--png", type=Path, default=Path("scaling.png"))
    args = parser.parse_args(argv)
    import onnxruntime as ort

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="tk-bench-"))
    model = tk.from_hf(gpt2_checkpoint(workdir / "gpt2-shape"), pad_id=0)
    folder = workdir / "transformer-kit-onnx"
    om = exported(model, folder, "cpu")
    session = ort.InferenceSession(str(folder / "decoder_step.onnx"), providers=["CPUExecutionProvider"])
    results: dict[str, list[tuple[int, float, float]]] = {}
    sweeps = {
        "step vs cache length (batch 1)": [(n, step_timers(model, session, 1, n)) for n in CACHE_LENGTHS],
        "step vs batch (cache 128)": [(b, step_timers(model, session, b, 128)) for b in BATCHES],
        "forward vs length (batch 1)": [(n, forward_timers(model, om, 1, n)) for n in LENGTHS],
        "forward vs batch (length 128)": [(b, forward_timers(model, om, b, 128)) for b in BATCHES],
    }
    for title, points in sweeps.items():
        print(title, file=sys.stderr)
        calls = args.calls if title.startswith("step") else max(3, args.calls // 3)
        results[title] = [(x, *_blocks(list(fns), calls)) for x, fns in points]
    print(f"\nGPT-2 shape, float32, {torch.get_num_threads()} threads; median of {args.calls} (steps) "
          f"or {max(3, args.calls // 3)} (forwards) consecutive calls per point and runtime")
    for title, rows in results.items():
        batched = title.split(" vs ")[1].startswith("batch")
        unit = "ms per step" if title.startswith("step") else "ms per forward"
        print(f"\n{title}\n| {'batch' if batched else 'tokens'} | onnxruntime {unit} | PyTorch eager "
              f"{unit} | onnxruntime / PyTorch |" + (" onnxruntime ms per row |" if batched else ""))
        print("| --- | --- | --- | --- |" + (" --- |" if batched else ""))
        for x, ort_s, eager_s in rows:
            per_row = f" {1e3 * ort_s / x:.2f} |" if batched else ""
            print(f"| {x} | {1e3 * ort_s:.2f} | {1e3 * eager_s:.2f} | {ort_s / eager_s:.2f}x |{per_row}")
    lengths, ort_times = zip(*[(x, o) for x, o, _ in results["step vs cache length (batch 1)"]], strict=True)
    a, b, worst = linear_fit(list(lengths), list(ort_times))
    print(f"\ncached decoding, onnxruntime: {1e3 * a:.3f} ms + {1e6 * b:.3f} us x cache length; "
          f"largest deviation from the line {worst:.1%}")
    lengths, eager_times = zip(*[(x, e) for x, _, e in results["step vs cache length (batch 1)"]],
                               strict=True)
    a, b, worst = linear_fit(list(lengths), list(eager_times))
    print(f"cached decoding, PyTorch eager: {1e3 * a:.3f} ms + {1e6 * b:.3f} us x cache length; "
          f"largest deviation from the line {worst:.1%}")
    _plot(results, args.png)
    print(f"plot: {args.png}")
    return 0


def _plot(results, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    for ax, (title, rows) in zip(axes.flat, results.items(), strict=True):
        xs = [r[0] for r in rows]
        ax.plot(xs, [1e3 * r[1] for r in rows], "o-", label="onnxruntime")
        ax.plot(xs, [1e3 * r[2] for r in rows], "s--", label="PyTorch eager")
        ax.set_title(title)
        ax.set_xlabel("batch" if title.split(" vs ")[1].startswith("batch") else "tokens")
        ax.set_ylabel("ms per step" if title.startswith("step") else "ms per forward")
        ax.set_ylim(bottom=0)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle("transformer-kit, GPT-2 shape (d_model 512, 6 layers), float32, CPU")
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
