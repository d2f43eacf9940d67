"""The kit's exports on onnxruntime's CUDA provider against PyTorch on the same GPU: decoding,
prefill and sentence embeddings, with the GPU's memory-bandwidth bound.

Decoder: a random bfloat16 checkpoint in a published shape (``--shape``, Qwen2.5-0.5B by default;
``testbed/random_checkpoints.py``), exported by the kit in float16 and in int4 (the
default ``Int4()``, with float32 activations and with float16 ones), without verification (the
GPU tests check the exports). Runners:

- ``kit float16``, ``kit int4``, ``kit int4 float16``: ``OnnxModel(folder, "cuda").generate`` (IO
  binding: the cache stays on the device);
- ``torch static``: transformers' ``generate`` on the same checkpoint in float16 with its static
  cache and automatic compilation off (``disable_compile=True``);
- ``torch static compiled``: the same with transformers' automatic ``torch.compile`` of the
  forward (what a static cache gets by default on CUDA), timed after its compiling calls; only
  with ``--compiled`` (a run of its own: batch-1 decoding of ``kit float16``, ``torch static``
  and this runner), since each cache length it meets compiles again (tens of seconds each).

Workloads, each greedy with exactly the new tokens asked (``min_new_tokens``): decoding at batch
1 and 16 (prompts of 16 tokens; tokens/s from ``(t(N) - t(1)) / (N - 1)`` a row, so the prefill
is left out), and prefill of 512 and 2,048 tokens at batch 1 (the time to the first token).
Encoder: a random sentence-transformers folder in bge-base-en-v1.5's shape (``benchmarks/
embeddings.py``), the kit's float16 export (``OnnxModel.encode``) against transformers'
``BertModel`` in float16 with CLS pooling and normalization, texts of 128 tokens in batches of
32: embeddings per second.

The bound: the GPU's copy bandwidth (a 1 GiB device-to-device copy, read and write counted) over
the bytes a decoding step reads (the export's weights; PyTorch's: 2 bytes a parameter), so
``tokens/s / bound`` is the share of the bandwidth a runner uses at batch 1.

All runners share one process (a device call's minutes are scarce; each call synchronizes the
GPU before it returns, so one runner does not run into the next), in ``--rounds`` interleaved
rounds, the order shuffled with a seed, each timed call after an untimed one; figures are
medians. Writes one JSON file (``--out``) and prints the table for BENCHMARKS.md.

    python benchmarks/gpu.py --out gpu.json              # on a GPU (benchmarks/gpu_session.sh)
    python benchmarks/gpu.py --compiled --out compiled.json   # the torch.compile runner
    python benchmarks/gpu.py --dry-run --out dry.json    # the CPU provider and small shapes
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

PROMPT = 16


def say(text: str) -> None:
    print(f"[{datetime.now(UTC):%H:%M:%S}] {text}", file=sys.stderr, flush=True)


def environment(device: str) -> dict:
    import onnxruntime as ort
    import transformers

    import transformer_kit

    return {"date": f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC", "device": device,
            "gpu": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
            "python": platform.python_version(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "onnxruntime": ort.__version__,
            "providers": ort.get_available_providers(), "transformers": transformers.__version__,
            "transformer_kit": getattr(transformer_kit, "__version__", "checkout")}


def copy_bandwidth(device: str) -> float:
    """Bytes a second of a 1 GiB copy on ``device`` (read and write counted); 256 MiB on a CPU."""
    size = (1 << 30) if device == "cuda" else (1 << 28)
    source = torch.empty(size, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    times = []
    for _ in range(6):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        target.copy_(source)
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return 2 * size / statistics.median(times[1:])


def synchronized(fn: Callable[[], object], device: str) -> Callable[[], float]:
    """A call of ``fn`` timed in seconds, the GPU's queue drained before and after."""
    def timed() -> float:
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start
    return timed


def decoder_runners(checkpoint: Path, folders: dict[str, Path], device: str, compiled_too: bool):
    """{runner: generate(ids, new_tokens) -> (rows, new) tokens} for the kit's exports and PyTorch
    (``compiled_too``: with the compiled runner)."""
    import transformers

    from transformer_kit.runtime import OnnxModel

    runners: dict[str, Callable] = {}
    for name, folder in folders.items():
        om = OnnxModel(folder, "cuda" if device == "cuda" else "cpu")

        def kit(ids, new, om=om):
            return om.generate(ids, max_new_tokens=new, min_new_tokens=new,
                               attention_mask=np.ones_like(ids))
        runners[name] = kit
    hf = transformers.AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float16).to(device).eval()
    for name, compiled in (("torch static", False), ("torch static compiled", True)):
        if compiled and not compiled_too:
            continue

        def peer(ids, new, compiled=compiled):
            tensor = torch.from_numpy(ids).to(device)
            with torch.inference_mode():
                return hf.generate(tensor, attention_mask=torch.ones_like(tensor), max_new_tokens=new,
                                   min_new_tokens=new, do_sample=False, pad_token_id=0,
                                   cache_implementation="static", disable_compile=not compiled
                                   ).cpu().numpy()[:, ids.shape[1]:]
        runners[name] = peer
    return runners


def decoding(runners: dict[str, Callable], vocab: int, device: str, batches: list[int],
             prefills: list[int], new: int, rounds: int) -> dict:
    """{runner: {workload: median seconds or tokens/s}}, interleaved rounds."""
    rng = np.random.default_rng(0)
    prompts = {f"batch {b}": rng.integers(3, vocab, (b, PROMPT)) for b in batches}
    prompts |= {f"prefill {n}": rng.integers(3, vocab, (1, n)) for n in prefills}
    calls: dict[tuple[str, str, int], Callable[[], float]] = {}
    for name, generate in runners.items():
        for workload, ids in prompts.items():
            for count in ((1, new) if workload.startswith("batch") else (1,)):
                call = lambda g=generate, i=ids, c=count: g(i, c)  # noqa: E731
                calls[name, workload, count] = synchronized(call, device)
    say(f"warming {len(calls)} calls (the compiled runner compiles here)")
    for call in calls.values():
        call()
    times: dict[tuple[str, str, int], list[float]] = {key: [] for key in calls}
    order = np.random.default_rng(1)
    for index in range(rounds):
        say(f"decoding round {index + 1}/{rounds}")
        keys = list(calls)
        for i in order.permutation(len(keys)):
            calls[keys[i]]()  # settle
            times[keys[i]].append(calls[keys[i]]())
    results: dict[str, dict[str, float]] = {}
    for name in runners:
        row = results.setdefault(name, {})
        for workload, ids in prompts.items():
            if (name, workload, 1) not in times:
                continue
            first = statistics.median(times[name, workload, 1])
            if workload.startswith("batch"):
                whole = statistics.median(times[name, workload, new])
                decoding_s = whole - first  # a dry run's few tokens may drown in noise: no rate then
                rate = len(ids) * (new - 1) / decoding_s if decoding_s > 0 else float("nan")
                row[f"{workload} tokens/s"] = rate
            else:
                row[f"{workload} ms"] = first * 1e3
    return results


def embeddings(workdir: Path, shape: str, device: str, rounds: int, texts: int, length: int) -> dict:
    """Embeddings per second of the kit's float16 export and of transformers' BertModel (float16)."""
    import transformers
    from embeddings import write_checkpoint

    import transformer_kit as tk
    from transformer_kit.apps.benchmark import export_unless_current
    from transformer_kit.runtime import OnnxModel

    folder = write_checkpoint(workdir / f"{shape}-st", shape)
    export = workdir / f"{shape}-kit-float16"
    export_unless_current(tk.from_hf(folder), export, dtype="float16", verify=False)
    om = OnnxModel(export, "cuda" if device == "cuda" else "cpu")
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    ids = np.random.default_rng(2).integers(5, vocab, (texts, length))
    bert = transformers.BertModel.from_pretrained(folder, dtype=torch.float16).to(device).eval()
    pooling = json.loads((folder / "1_Pooling" / "config.json").read_text())

    def torch_encode() -> np.ndarray:
        out = []
        with torch.inference_mode():
            for start in range(0, texts, 32):
                batch = torch.from_numpy(ids[start:start + 32]).to(device)
                hidden = bert(batch, attention_mask=torch.ones_like(batch)).last_hidden_state
                pooled = hidden[:, 0] if pooling["pooling_mode_cls_token"] else hidden.mean(1)
                out.append(torch.nn.functional.normalize(pooled.float(), dim=-1).cpu().numpy())
        return np.concatenate(out)

    calls = {"kit float16": synchronized(lambda: om.encode(ids.tolist(), batch_size=32), device),
             "torch float16": synchronized(torch_encode, device)}
    difference = float(np.abs(om.encode(ids[:32].tolist()) - torch_encode()[:32]).max())
    times: dict[str, list[float]] = {name: [] for name in calls}
    for index in range(rounds):
        say(f"embedding round {index + 1}/{rounds}")
        for name in sorted(calls, key=lambda n: (n, index) if index % 2 else (-len(n), n)):
            calls[name]()
            times[name].append(calls[name]())
    return {"shape": shape, "texts": texts, "tokens a text": length, "batch": 32,
            "max abs difference": difference,
            **{f"{name} embeddings/s": texts / statistics.median(t) for name, t in times.items()}}


def main(argv: list[str] | None = None) -> int:
    from testbed.genai_peer import write_tokenizer
    from testbed.random_checkpoints import SHAPES, write_random_checkpoint
    from transformer_kit.apps.benchmark import export_is_current, export_unless_current, folder_bytes

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default=None,
                        help="the decoder's shape (default qwen2.5-0.5b; llama-100m in a dry run)")
    parser.add_argument("--workdir", type=Path, default=Path("bench-gpu"))
    parser.add_argument("--out", type=Path, default=Path("gpu.json"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=None, help="default 128 (8 in a dry run)")
    parser.add_argument("--compiled", action="store_true",
                        help="batch-1 decoding of kit float16 and PyTorch with and without torch.compile "
                        "(a run of its own: compiling takes minutes)")
    parser.add_argument("--dry-run", action="store_true",
                        help="the CPU provider and small shapes: checks the script, not the GPU")
    args = parser.parse_args(argv)
    device = "cpu" if args.dry_run else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device for PyTorch here; use --dry-run to check the script on the CPU")
    shape = args.shape or ("llama-100m" if args.dry_run else "qwen2.5-0.5b")
    new = args.new_tokens or (8 if args.dry_run else 128)
    batches, prefills = ([1, 4], [64, 128]) if args.dry_run else ([1, 16], [512, 2048])
    if args.compiled:
        batches, prefills = [1], []
    args.workdir.mkdir(parents=True, exist_ok=True)
    result: dict = {"environment": environment(device), "shape": shape, "new tokens": new,
                    "prompt": PROMPT, "rounds": args.rounds, "command": " ".join(["python", *sys.argv])}
    say(f"{result['environment']['gpu']}: copy bandwidth")
    bandwidth = copy_bandwidth(device)
    result["copy bandwidth GB/s"] = bandwidth / 1e9

    import transformer_kit as tk
    from transformer_kit.export import Int4

    checkpoint = args.workdir / f"{shape}-bf16"
    if not (checkpoint / "config.json").exists():
        say(f"writing a random {shape} checkpoint")
        write_random_checkpoint(checkpoint, shape)
        write_tokenizer(checkpoint, 1000)
    folders = {name: args.workdir / f"{shape}-{name.replace(' ', '-')}"
               for name in ("kit float16", "kit int4", "kit int4 float16")}
    model = None
    for name, folder in folders.items():
        quantize = Int4() if "int4" in name else None
        dtype = "float16" if name.endswith("float16") else "float32"
        if not export_is_current(folder, quantize, dtype):
            say(f"exporting {name}")
            model = model or tk.from_hf(checkpoint)
            export_unless_current(model, folder, verify=False, quantize=quantize, dtype=dtype)
    del model
    config = json.loads((checkpoint / "config.json").read_text())
    parameters = sum(np.prod(s) for s in _shapes(config))
    read = {name: folder_bytes(folder) for name, folder in folders.items()}  # the graphs and weights
    if args.compiled:
        folders = {"kit float16": folders["kit float16"]}
    runners = decoder_runners(checkpoint, folders, device, args.compiled)
    read |= {name: 2 * parameters for name in runners if name.startswith("torch")}
    rows = decoding(runners, config["vocab_size"], device, batches, prefills, new, args.rounds)
    for name, row in rows.items():
        row["bytes a token"] = read[name]
        row["bound tokens/s"] = bandwidth / read[name]
        row["share of the bound, batch 1"] = row["batch 1 tokens/s"] / row["bound tokens/s"]
    result["decoding"] = rows
    if not args.compiled:
        texts, length = (64, 32) if args.dry_run else (1024, 128)
        result["embeddings"] = embeddings(args.workdir, "tiny" if args.dry_run else "bge-base", device,
                                          args.rounds, texts, length)
    args.out.write_text(json.dumps(result, indent=1, default=float))
    print(table(result))
    return 0


def _shapes(config: dict):
    from testbed.random_checkpoints import tensor_shapes

    return [shape for _, shape in tensor_shapes(config)]


def table(result: dict) -> str:
    """The Markdown table of a result, with the ratios to ``torch static``."""
    env = result["environment"]
    rows = result["decoding"]
    base = rows.get("torch static", {})
    lines = [f"{env['gpu']}, {env['date']}; torch {env['torch']} (CUDA {env['cuda']}), onnxruntime "
             f"{env['onnxruntime']}, transformers {env['transformers']}; copy bandwidth "
             f"{result['copy bandwidth GB/s']:.0f} GB/s; {result['shape']}, prompts of {result['prompt']} "
             f"tokens, {result['new tokens']} new tokens, {result['rounds']} rounds",
             ""]
    first = next(iter(rows.values()))
    keys = [k for k in first if k.startswith("batch")]
    prefill = [k for k in first if k.startswith("prefill")]
    header = [h for k in keys for h in (k.replace("tokens/s", "tok/s"), "vs torch static")]
    header += [*prefill, "bytes a token", "share of the bound, batch 1"]
    lines += ["| runner | " + " | ".join(header) + " |", "| --- |" + " ---: |" * len(header)]
    for name, row in rows.items():
        cells = []
        for key in keys:
            if key not in row:
                cells += ["-", "-"]
                continue
            cells += [f"{row[key]:.1f}", f"{row[key] / base[key]:.2f}x" if key in base else "-"]
        cells += [f"{row[k]:.1f}" if k in row else "-" for k in prefill]
        cells += [f"{row['bytes a token'] / 1e6:.0f} MB", f"{row['share of the bound, batch 1']:.0%}"]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    emb = result.get("embeddings")
    if emb is None:
        return "\n".join(lines)
    lines += ["", f"Embeddings ({emb['shape']} shape, {emb['texts']} texts of {emb['tokens a text']} tokens, "
              f"batches of {emb['batch']}; max abs difference {emb['max abs difference']:.1e}): "
              + ", ".join(f"{k.removesuffix(' embeddings/s')} {v:.0f}/s" for k, v in emb.items()
                          if k.endswith("embeddings/s"))]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
