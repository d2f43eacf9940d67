"""transformer-kit against llama.cpp on the same mixture-of-experts weights (a random Qwen3-MoE GGUF).

Two random ``qwen3moe`` GGUF files of one shape are written with gguf, tensor by tensor
(``testbed/moe_gguf.py``): an F32 one and a Q4_0 one (llama-quantize's types: Q4_0 matrices, a
Q6_K head, F32 routers and norms). The default shape, ``qwen3-moe-small``, is a Qwen3-MoE a CPU
decodes at a useful speed and both runtimes hold in float32 at once on a 24 GB machine:
Qwen3-0.6B's attention (hidden 1024, 16 heads, 8 KV heads of 128) over 16 layers of 64 experts,
8 per token, each 256 wide (Qwen3-30B-A3B's expert width over hidden, 768 / 2048), a 32k
vocabulary: 0.97B parameters (3.9 GB in F32, 0.55 GB in Q4_0), 0.24B of them read per token,
about as many in experts as in attention, as in the 30B model (a Qwen-sized 152k vocabulary
would make the head the largest read of every token at this width).

Runners, each in its own process (:class:`testbed.peers.ProcessPeer`), each with 2 threads:

- llama.cpp (llama-cpp-python) on the F32 file and on the Q4_0 file, each also with
  ``OMP_WAIT_POLICY=PASSIVE`` (its OpenMP threads spin while they wait, which helps on an idle
  machine and hurts badly on a loaded one): prompt, then one ``eval`` per token, argmax of its
  logits;
- transformer-kit's onnxruntime on ``export_onnx(tk.from_gguf(F32 file))`` (float32: its greedy
  tokens should be llama.cpp's on the F32 file; the table says how many leading tokens agree);
- transformer-kit's onnxruntime on ``export_onnx(tk.from_gguf(Q4_0 file), quantize=Int4())`` and
  ``Int4(accuracy_level=1)``: each MoE layer one ``QMoE`` op of the file's own Q4_0 blocks.

Each export runs in a process of its own (bounded memory), once per workdir. Each round asks
every runner in turn (the order rotating) for the prompt and exactly ``--new-tokens`` greedy
tokens; tokens/s are medians over rounds, ratios are taken within a round (against llama.cpp on
the same file's type and against llama.cpp's Q4_0, each spinning and passive). Each round also
times the prompt and its first token alone, so the table splits each runner's time as
llama-bench does: prompt tokens/s (prefill) and decode tokens/s (the other new tokens). Acceptance
target: kit int4 >= 1.2x llama.cpp Q4_0. Results are written to ``WORKDIR/moe_llama_cpp.json``.

    python benchmarks/moe_llama_cpp.py [--rounds 5] [--new-tokens 32] [--prompt-tokens N] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # testbed/: helpers the benchmarks share

from benchmarks.gguf_llama_cpp import PROMPT, THREADS, worker
from testbed.moe_gguf import SHAPES, write_moe_gguf
from testbed.peers import ProcessPeer, shared_prefix

LLAMA_F32, LLAMA_Q4 = "llama.cpp F32", "llama.cpp Q4_0"
PASSIVE = ", OMP passive"  # the same runner with OMP_WAIT_POLICY=PASSIVE
LLAMA_F32_PASSIVE, LLAMA_Q4_PASSIVE = LLAMA_F32 + PASSIVE, LLAMA_Q4 + PASSIVE
KIT_F32, KIT_INT4, KIT_INT4_L1 = "kit float32", "kit int4", "kit int4 level 1"
#: runner -> (the GGUF file's type, the export's folder or None for llama.cpp, the llama.cpp runner
#: on the same file)
RUNNERS = {
    LLAMA_F32: ("F32", None, LLAMA_F32),
    LLAMA_F32_PASSIVE: ("F32", None, LLAMA_F32),
    LLAMA_Q4: ("Q4_0", None, LLAMA_Q4),
    LLAMA_Q4_PASSIVE: ("Q4_0", None, LLAMA_Q4),
    KIT_F32: ("F32", "kit-float32", LLAMA_F32),
    KIT_INT4: ("Q4_0", "kit-int4", LLAMA_Q4),
    KIT_INT4_L1: ("Q4_0", "kit-int4-level1", LLAMA_Q4),
}


def gguf_files(workdir: Path, shape: str) -> dict[str, Path]:
    """The shape's F32 and Q4_0 files (written once per workdir)."""
    files = {}
    for qtype in ("F32", "Q4_0"):
        path = workdir / f"{shape}-{qtype.lower()}.gguf"
        if not path.exists():
            start = time.perf_counter()
            write_moe_gguf(path.with_suffix(".partial"), shape, qtype).rename(path)
            print(f"wrote {path} ({path.stat().st_size / 1e9:.2f} GB, {time.perf_counter() - start:.0f} s)",
                  file=sys.stderr)
        files[qtype] = path
    return files


def export(kind: str, source: str, folder: str) -> None:
    """The export ``kind`` of GGUF file ``source`` into ``folder`` (run in a child process);
    writes the report's weight origins beside the folder."""
    import transformer_kit as tk
    from transformer_kit.export import Int4, export_onnx

    options = {"kit-float32": {}, "kit-int4": {"quantize": Int4()},
               "kit-int4-level1": {"quantize": Int4(accuracy_level=1)}}[kind]
    start = time.perf_counter()
    report = export_onnx(tk.from_gguf(source), folder, verify=False, **options)
    print(report, file=sys.stderr)
    Path(f"{folder}.origins.json").write_text(json.dumps(
        {"seconds": time.perf_counter() - start, "origins": report.weight_origins}))


def export_all(workdir: Path, files: dict[str, Path], runners: list[str]) -> dict[str, Path]:
    """Each kit runner's folder, exported once per workdir in a process of its own."""
    folders = {}
    for name in runners:
        qtype, kind, _ = RUNNERS[name]
        if kind is None:
            continue
        folder = workdir / kind
        if not (folder / "manifest.json").exists():
            subprocess.run([sys.executable, __file__, "--export", kind, "--source", str(files[qtype]),
                            "--folder", str(folder)], check=True, stdout=sys.stderr)
        folders[name] = folder
    return folders


def origins_summary(folder: Path) -> str:
    """How many of an int4 export's matrices (MoE experts included) came from the file's blocks."""
    path = Path(f"{folder}.origins.json")
    if not path.exists():
        return "n/a"
    origins = json.loads(path.read_text())["origins"]
    kept = sum(str(o).startswith("GGUF ") for o in origins.values())
    return f"{kept} of {len(origins)} from the file's blocks"


def start_peer(name: str, files: dict[str, Path], folders: dict[str, Path], prompt: list[int],
               new_tokens: int) -> ProcessPeer:
    """Runner ``name`` in a process of its own: ``benchmarks/gguf_llama_cpp.py``'s worker."""
    qtype, kind, _ = RUNNERS[name]
    target = files[qtype] if kind is None else folders[name]
    env = {"OMP_WAIT_POLICY": "PASSIVE"} if name.endswith(PASSIVE) else None
    return ProcessPeer(name, [sys.executable, __file__, "--worker", "llama.cpp" if kind is None else "kit",
                              "--folder", str(target), "--new-tokens", str(new_tokens)], prompt, env)


def cpu_name() -> str:
    return next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                 if line.startswith("model name")), platform.processor())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="qwen3-moe-small", choices=sorted(SHAPES))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=None,
                        help="the prompt's length (the prompt text's tokens repeated); default: the text's")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--skip", nargs="*", default=[], choices=sorted(RUNNERS),
                        help="runners to leave out")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--folder", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--export", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--source", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker, args.folder, args.new_tokens)
    if args.export:
        return export(args.export, args.source, args.folder)
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench-moe-"))
    workdir.mkdir(parents=True, exist_ok=True)
    names = [name for name in RUNNERS if name not in args.skip]
    files = gguf_files(workdir, args.shape)
    folders = export_all(workdir, files, names)
    from llama_cpp import Llama
    from llama_cpp import __version__ as llama_version

    prompt = Llama(model_path=str(files["Q4_0"]), vocab_only=True, verbose=False).tokenize(
        PROMPT.encode(), add_bos=False)
    if args.prompt_tokens:
        prompt = (prompt * (args.prompt_tokens // len(prompt) + 1))[:args.prompt_tokens]
    load = os.getloadavg()
    started = datetime.now(UTC)
    peers = [start_peer(name, files, folders, prompt, args.new_tokens) for name in names]
    by_name = {p.name: p for p in peers}
    # each runner's speed against each baseline (a function of the runner: the llama.cpp runner it is
    # compared with), a ratio per round
    baselines = {"same file": lambda name: RUNNERS[name][2],
                 "same file" + PASSIVE: lambda name: RUNNERS[name][2] + PASSIVE,
                 "Q4_0": lambda name: LLAMA_Q4, "Q4_0" + PASSIVE: lambda name: LLAMA_Q4_PASSIVE}
    ratios = {b: {name: [] for name in names} for b in baselines}
    # the same two ways apart: the prompt (prefill and first token) and the decoding of the rest,
    # llama-bench's pp and tg, against llama.cpp on the same file and on Q4_0 (spinning)
    phases = ("prompt", "decode")
    split = {phase: {b: {name: [] for name in names} for b in ("same file", "Q4_0")} for phase in phases}
    first: dict[str, list[float]] = {name: [] for name in names}
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=Console(stderr=True)) as progress:
        task = progress.add_task(f"{len(peers)} runners, {args.rounds} rounds",
                                 total=args.rounds * len(peers))
        for index in range(args.rounds):
            shift = index % len(peers)
            times, prefill = {}, {}
            for peer in [*peers[shift:], *peers[:shift]]:
                times[peer.name] = peer.run()["seconds"]
                prefill[peer.name] = peer.run("first")["seconds"]
                peer.seconds.append(times[peer.name])
                first[peer.name].append(prefill[peer.name])
                progress.advance(task)
            decode = {name: times[name] - prefill[name] for name in times}
            for baseline, against in baselines.items():
                for name in names:
                    if against(name) in times:
                        ratios[baseline][name].append(times[against(name)] / times[name])
                        if baseline in ("same file", "Q4_0"):
                            split["prompt"][baseline][name].append(prefill[against(name)] / prefill[name])
                            split["decode"][baseline][name].append(decode[against(name)] / decode[name])
    for peer in peers:
        peer.close()

    def median(values: list[float]) -> float | None:
        return statistics.median(values) if values else None

    results = {
        "date": f"{started:%Y-%m-%d %H:%M} UTC", "cpu": cpu_name(), "cores": os.cpu_count(),
        "load_average": [load[0], os.getloadavg()[0]], "threads": THREADS, "rounds": args.rounds,
        "command": " ".join(["python", *sys.argv]), "llama_cpp_python": llama_version,
        "shape": {"name": args.shape, **vars(SHAPES[args.shape]),
                  "parameters": SHAPES[args.shape].parameters(),
                  "active_parameters": SHAPES[args.shape].active_parameters()},
        "files": {q: {"path": str(p), "bytes": p.stat().st_size} for q, p in files.items()},
        "prompt_tokens": len(prompt), "new_tokens": args.new_tokens, "runners": {}}
    for name in names:
        peer = by_name[name]
        same = RUNNERS[name][2]
        results["runners"][name] = {
            "gguf_type": RUNNERS[name][0], "seconds": peer.seconds,
            "tokens_per_s": args.new_tokens / statistics.median(peer.seconds),
            "first_token_seconds": first[name],
            "prompt_tokens_per_s": len(prompt) / statistics.median(first[name]),
            "decode_tokens_per_s": (args.new_tokens - 1) / statistics.median(
                [whole - part for whole, part in zip(peer.seconds, first[name], strict=True)]),
            "split_vs_llama_cpp": {phase: {b: median(split[phase][b][name]) for b in split[phase]}
                                   for phase in phases},
            "vs_llama_cpp": {baseline: median(ratios[baseline][name]) for baseline in baselines},
            "tokens": peer.tokens,
            "greedy_shared_with_llama_cpp_same_file": (shared_prefix(peer.tokens, by_name[same].tokens)
                                                       if same in by_name else None),
            "int4_origins": origins_summary(folders[name]) if name in (KIT_INT4, KIT_INT4_L1) else None}
    (workdir / "moe_llama_cpp.json").write_text(json.dumps(results, indent=1))

    shape = SHAPES[args.shape]
    print(f"\n{results['date']}, {results['cpu']}, {os.cpu_count()} cores (load average {load[0]:.1f} "
          f"before, {os.getloadavg()[0]:.1f} after), {THREADS} threads a runner, {args.rounds} rounds, "
          f"prompt {len(prompt)} tokens + {args.new_tokens} new, llama-cpp-python {llama_version}"
          f"\n    {results['command']}\n{args.shape}: {shape.parameters() / 1e9:.2f}B parameters, "
          f"{shape.active_parameters() / 1e9:.2f}B read per token; "
          + ", ".join(f"{q} file {p.stat().st_size / 1e9:.2f} GB" for q, p in files.items()) + "\n")
    print("| runner | file | tokens/s | " + " | ".join(f"vs llama.cpp {b}" for b in baselines)
          + " | greedy tokens shared with llama.cpp, same file |")
    print("|---|---|---:|" + "---:|" * len(baselines) + "---:|")
    for name, row in results["runners"].items():
        def ratio(value: float | None) -> str:
            return "" if value is None else f"{value:.2f}x"
        shared = row["greedy_shared_with_llama_cpp_same_file"]
        print(f"| {name} | {row['gguf_type']} | {row['tokens_per_s']:.1f} | "
              + " | ".join(ratio(row["vs_llama_cpp"][b]) for b in baselines)
              + f" | {'' if shared is None else f'{shared}/{args.new_tokens}'} |")
    print(f"\nThe same apart (prompt: its {len(prompt)} tokens and the first new one; decode: the "
          f"other {args.new_tokens - 1}):\n")
    print("| runner | prompt tokens/s | vs llama.cpp same file | vs llama.cpp Q4_0 | decode tokens/s "
          "| vs llama.cpp same file | vs llama.cpp Q4_0 |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, row in results["runners"].items():
        cells = [f"{row['prompt_tokens_per_s']:.0f}"]
        cells += ["" if row["split_vs_llama_cpp"]["prompt"][b] is None
                  else f"{row['split_vs_llama_cpp']['prompt'][b]:.2f}x" for b in ("same file", "Q4_0")]
        cells += [f"{row['decode_tokens_per_s']:.1f}"]
        cells += ["" if row["split_vs_llama_cpp"]["decode"][b] is None
                  else f"{row['split_vs_llama_cpp']['decode'][b]:.2f}x" for b in ("same file", "Q4_0")]
        print(f"| {name} | " + " | ".join(cells) + " |")
    for name in (KIT_INT4, KIT_INT4_L1):
        if name in results["runners"]:
            print(f"\n{name}: int4 matrices {results['runners'][name]['int4_origins']}")
    print(f"\nresults: {workdir / 'moe_llama_cpp.json'}")


if __name__ == "__main__":
    main()
