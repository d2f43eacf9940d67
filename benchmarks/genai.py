"""transformer-kit against onnxruntime-genai on a Llama shape, in float32 and int4.

A random Llama checkpoint (hidden 512, 8 layers, 8 heads, 2 KV heads, intermediate 1376,
vocabulary 8000) with a tokenizer trained here is written with save_pretrained; transformer-kit
imports and exports it (float32, and int4: MatMulNBits, block 32, accuracy level 4, symmetric,
head quantized), onnxruntime-genai's model builder builds it (``-p fp32`` and ``-p int4``, CPU).
Every runner is timed in interleaved rounds, in four workloads: batch 1 decoding (16 + 64
tokens), prefill latency (first token of a 16- and a 512-token prompt) and batch 8 decoding.
Reports tokens/s, ratios within rounds, token agreement, folder bytes and peak RSS, and draws
``genai.png``.

    pip install -e ".[bench]"
    python benchmarks/genai.py [--rounds 5] [--workdir bench-genai] [--png benchmarks/genai.png]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # testbed/: helpers the benchmarks share

import transformer_kit as tk
from testbed.genai_peer import GenaiGenerator, build_genai, genai_version, llama_checkpoint
from transformer_kit.apps.benchmark import (
    Runner,
    exported,
    folder_bytes,
    interleaved,
    random_prompts,
    ratio_to,
)
from transformer_kit.export.quantize import Int4

ROOT = Path(__file__).resolve().parents[1]
PRECISIONS = ("float32", "int4")
# VmHWM (peak resident set of this process image; ru_maxrss would carry the parent's over exec)
RSS_CODE = """
import re, numpy as np
def peak():
    return int(re.search(r"VmHWM:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)) * 1024
{load}
ids = np.arange(3, 19, dtype=np.int64)[None]
run(ids)
print(peak() - base)
"""
KIT_LOAD = """import onnxruntime
from transformer_kit.runtime import OnnxModel
base = peak()
om = OnnxModel({folder!r}, providers="cpu")
run = lambda ids: om.generate(ids, max_new_tokens=64)"""
GENAI_LOAD = """import onnxruntime_genai
from testbed.genai_peer import GenaiGenerator
base = peak()
generator = GenaiGenerator({folder!r})
run = lambda ids: generator.generate(ids, 64)"""


def peak_rss(load: str, folder: Path) -> int:
    """Bytes of peak RSS added by loading ``folder`` and generating 64 tokens, in a fresh
    process (after its imports)."""
    code = RSS_CODE.format(load=load.format(folder=str(folder)))
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)  # testbed/
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            env={**os.environ, "PYTHONPATH": path})
    return int(result.stdout.strip().splitlines()[-1])


def runners(models: dict, ids: np.ndarray, new: int) -> list[Runner]:
    out = []
    for precision in PRECISIONS:
        om, generator = models[precision]
        out.append(Runner(f"transformer-kit, {precision}",
                          lambda om=om: om.generate(ids, max_new_tokens=new, min_new_tokens=new),
                          lambda r: int(r.size)))
        out.append(Runner(f"onnxruntime-genai, {precision}",
                          lambda g=generator: g.generate(ids, new), lambda r: int(r.size)))
    return out


def workload(title: str, models: dict, ids: np.ndarray, new: int, rounds: int, latency: bool) -> dict:
    # settle: each timed call follows an untimed one of the same runner. The two runtimes'
    # thread pools spin for a while after a run; without it, the one timed after the other
    # shares the 2 cores with the other's spinning threads (measured: the kit's int4 decoding
    # read 0.74x onnxruntime-genai's unsettled, 0.88x settled, in the same minutes)
    timings, _ = interleaved(runners(models, ids, new), rounds, settle=True,
                             progress=lambda text: print(f"{title}: {text}", file=sys.stderr))
    by = {t.name: t for t in timings}
    print(f"\n### {title}\n")
    unit = "ms" if latency else "tokens/s"
    print(f"| runtime | {unit} (median) | all rounds | kit / genai, same precision |")
    print("| --- | --- | --- | --- |")
    rows = {}
    for t in timings:
        values = [s * 1e3 for s in t.seconds] if latency else [t.tokens / s for s in t.seconds]
        value = t.median * 1e3 if latency else t.tokens_per_s
        precision = t.name.split(", ")[1]
        ratio = ratio_to(timings, f"onnxruntime-genai, {precision}", f"transformer-kit, {precision}")
        shown = f"{ratio:.2f}x" if t.name.startswith("transformer-kit") else ""
        print(f"| {t.name} | {value:.1f} | {' '.join(f'{v:.0f}' for v in values)} | {shown} |")
        rows[t.name] = {"median": value, "rounds": values, "ratio_to_genai": ratio if shown else None}
    agreement = {p: float((by[f"transformer-kit, {p}"].result == by[f"onnxruntime-genai, {p}"].result).mean())
                 for p in PRECISIONS}
    print(f"\ntoken agreement kit vs genai: float32 {agreement['float32']:.1%}, int4 {agreement['int4']:.1%}")
    return {"rows": rows, "agreement": agreement}


def plot(results: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results["batch 1 decoding"]["rows"])
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key in zip(axes, ["batch 1 decoding", "batch 8 decoding"], strict=True):
        values = [results[key]["rows"][n]["median"] for n in names]
        colors = ["tab:blue" if n.startswith("transformer-kit") else "tab:gray" for n in names]
        ax.bar(range(len(names)), values, color=colors)
        ax.set_xticks(range(len(names)), [n.replace(", ", "\n") for n in names], fontsize=8)
        ax.set_ylabel("tokens/s")
        ax.set_title(key)
        for i, v in enumerate(values):
            ax.text(i, v, f"{v:.0f}", ha="center", va="bottom", fontsize=8)
    fig.suptitle("Llama shape (512 hidden, 8 layers, GQA 8/2), greedy, 2-core CPU")
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--long-prompt", type=int, default=512)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--png", type=Path, default=None)
    parser.add_argument("--small", action="store_true", help="a tiny Llama shape (for the smoke test)")
    args = parser.parse_args(argv)
    if genai_version() is None:
        print("onnxruntime-genai is not installed: pip install -e '.[bench]'", file=sys.stderr)
        return 2
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="tk-genai-"))
    shape = ({"hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 96, "vocab": 512}
             if args.small else {})
    checkpoint = llama_checkpoint(workdir / "llama-shape", **shape)
    model = tk.from_hf(checkpoint)
    folders = {"float32": (workdir / "kit-float32", workdir / "genai-float32"),
               "int4": (workdir / "kit-int4", workdir / "genai-int4")}
    models = {}
    for precision, (kit, genai) in folders.items():
        # genai's builder quantizes the embedding only when a tied head shares it: the same recipe
        options = {"quantize": Int4(embedding=model.config.tie_embeddings)} if precision == "int4" else {}
        om = exported(model, kit, providers="cpu", **options)
        build_genai(checkpoint, genai, "fp32" if precision == "float32" else "int4", workdir)
        models[precision] = (om, GenaiGenerator(genai))
    cfg = model.config
    avoid = {0, cfg.bos_id, *cfg.eos_ids}
    prompt = random_prompts(cfg.vocab_size, 1, 16, avoid).numpy()
    long_prompt = random_prompts(cfg.vocab_size, 1, args.long_prompt, avoid, seed=1).numpy()
    batch = random_prompts(cfg.vocab_size, args.batch, 16, avoid, seed=2).numpy()
    print(f"Llama shape {shape or 'hidden 512, 8 layers, 8/2 heads, 1376, vocab 8000'}; "
          f"onnxruntime-genai {genai_version()}; {args.rounds} interleaved rounds")
    results = {
        "batch 1 decoding": workload(f"batch 1 decoding, 16 + {args.new_tokens} tokens", models, prompt,
                                     args.new_tokens, args.rounds, latency=False),
        "prefill 16": workload("prefill latency, 16-token prompt (time to the first token)", models,
                               prompt, 1, args.rounds, latency=True),
        "prefill long": workload(f"prefill latency, {args.long_prompt}-token prompt", models, long_prompt,
                                 1, args.rounds, latency=True),
        "batch 8 decoding": workload(f"batch {args.batch} decoding, 16 + {args.new_tokens} tokens",
                                     models, batch, args.new_tokens, args.rounds, latency=False),
    }
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    print("\n### Export folders and memory (load + 64 greedy tokens, fresh process)\n")
    print(f"weights: {weights / 1e6:.1f} MB of float32 parameters\n")
    print("| runtime | graphs + weights | vs float32 weights | peak RSS added | vs its folder |")
    print("| --- | --- | --- | --- | --- |")
    sizes = {}
    for precision, (kit, genai) in folders.items():
        for name, folder, load in ((f"transformer-kit, {precision}", kit, KIT_LOAD),
                                   (f"onnxruntime-genai, {precision}", genai, GENAI_LOAD)):
            size, rss = folder_bytes(folder), peak_rss(load, folder)
            sizes[name] = {"folder": size, "peak_rss": rss}
            print(f"| {name} | {size / 1e6:.1f} MB | {size / weights:.2f}x | {rss / 1e6:.0f} MB | "
                  f"{rss / size:.2f}x |")
    results["sizes"] = sizes
    (workdir / "genai-results.json").write_text(json.dumps(results, indent=1))
    if args.png:
        plot(results, args.png)
        print(f"\nplot: {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
