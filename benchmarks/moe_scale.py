"""A Qwen3-30B-A3B-shaped GGUF file on this machine: the kit's int4 export, its loading and decoding,
against llama.cpp on the same file and onnxruntime-genai's builder.

The file is a random ``qwen3moe`` GGUF of Qwen3-30B-A3B's shape (``testbed/moe_gguf.py``:
hidden 2048, 48 layers of 128 experts, 8 per token, 768 wide, 32 heads, 4 KV heads of 128, a
151,936-token vocabulary; 30.5B parameters, 3.0B read per token; 17.3 GB in Q4_0), written
tensor by tensor if missing (``--write``). Each step runs in a process of its own under
``/usr/bin/time`` (peak resident memory, wall seconds: ``benchmarks/export_scale.py``'s
:func:`measured`), and writes its own figures to a JSON file:

- ``kit export``: ``tk.from_gguf(file, stream=True)`` (the weights stay in the file) then
  ``export_onnx(model, out, quantize=Int4(), verify=...)``: time, peak RSS, the folder's bytes,
  the report's weight origins;
- ``kit generate``: ``OnnxModel(out)`` (load seconds), then 4 greedy tokens untimed (the
  warm-up) and ``--new-tokens`` greedy tokens after the prompt, 2 threads: tokens/s;
- ``llama.cpp`` and ``llama.cpp, OMP passive`` (llama-cpp-python, 2 threads, ``n_ctx`` 512,
  memory-mapped as llama.cpp does by default): load seconds, the same warm-up and greedy tokens;
  with ``OMP_WAIT_POLICY=PASSIVE`` too, as ``benchmarks/gguf_llama_cpp.py`` explains;
- ``genai int4``: ``python -m onnxruntime_genai.models.builder -m CONFIG -i FILE -p int4 -e cpu``
  in its own venv (``--builder-python``), given a folder with the shape's config.json and a
  tokenizer (its GGUF input reads the config of ``-m``); the refusal sentence is recorded when
  it refuses.

Results: ``WORKDIR/moe_scale.json`` and a table.

    python benchmarks/moe_scale.py --gguf /work/bench/moe/qwen3-30b-a3b-q4_0.gguf \\
        --workdir /work/bench/moe/scale [--write] [--new-tokens 32] [--skip genai]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # testbed/: helpers the benchmarks share

from benchmarks.export_scale import measured
from benchmarks.gguf_llama_cpp import PROMPT, THREADS, greedy_generator
from testbed.moe_gguf import SHAPES, vocabulary, write_moe_gguf

STEPS = ("kit export", "kit generate", "llama.cpp", "llama.cpp, OMP passive", "genai int4")
WARM_UP_TOKENS = 4


def _rss_now() -> int:
    """This process's resident bytes now (/proc/self/statm)."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# -- the steps, each in a child process writing its figures to ``result`` ----------------------
def step_export(gguf: str, out: str, verify: bool, result: str) -> None:
    import transformer_kit as tk
    from transformer_kit.export import Int4, export_onnx

    figures: dict = {"verify": verify}
    start = time.perf_counter()
    model = tk.from_gguf(gguf, stream=True)  # the weights stay in the file until written
    figures["from_gguf_seconds"] = time.perf_counter() - start
    figures["rss_after_from_gguf"] = _rss_now()
    start = time.perf_counter()
    report = export_onnx(model, out, quantize=Int4(), verify=verify)
    figures["export_seconds"] = time.perf_counter() - start
    print(report, file=sys.stderr)
    origins = report.weight_origins
    figures["report"] = str(report)
    figures["int4_from_file_blocks"] = sum(str(o).startswith("GGUF ") for o in origins.values())
    figures["int4_matrices"] = len(origins)
    Path(result).write_text(json.dumps(figures))


def step_generate(kind: str, target: str, prompt: list[int], new_tokens: int, result: str) -> None:

    start = time.perf_counter()
    generate = greedy_generator(kind, target, prompt)
    figures = {"load_seconds": time.perf_counter() - start, "rss_after_load": _rss_now()}
    start = time.perf_counter()
    generate(WARM_UP_TOKENS)
    figures["warm_up_seconds"] = time.perf_counter() - start  # the first call: pages read, sessions made
    start = time.perf_counter()
    tokens = generate(new_tokens)
    figures["generate_seconds"] = time.perf_counter() - start
    figures["tokens_per_s"] = new_tokens / figures["generate_seconds"]
    figures["tokens"] = tokens
    figures["peak_rss_self"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    Path(result).write_text(json.dumps(figures))


# -- onnxruntime-genai's builder ----------------------------------------------------------------
def config_folder(workdir: Path, shape_name: str) -> Path:
    """The shape's config.json (Qwen3MoeForCausalLM) and a tokenizer of its vocabulary's size,
    for the builder's ``-m`` (its GGUF input reads the model's config and tokenizer from it)."""
    shape = SHAPES[shape_name]
    folder = workdir / f"{shape_name}-config"
    if (folder / "tokenizer.json").exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    ids = vocabulary(shape.vocab_size)[3]
    config = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
              **{k: v for k, v in vars(shape).items()}, "hidden_act": "silu", "norm_topk_prob": True,
              "decoder_sparse_step": 1, "mlp_only_layers": [], "tie_word_embeddings": False,
              "attention_bias": False, "bos_token_id": ids["<|endoftext|>"],
              "eos_token_id": ids["<|im_end|>"], "torch_dtype": "bfloat16"}
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    tokens, _, merges, _ = vocabulary(shape.vocab_size)
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, t in enumerate(tokens) if t.startswith("<|")]
    tokenizer = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": None, "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False,
                                              "trim_offsets": True, "use_regex": True},
        "post_processor": None, "decoder": {"type": "ByteLevel", "add_prefix_space": True,
                                            "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": False, "vocab": {t: i for i, t in enumerate(tokens)},
                  "merges": [m.split(" ", 1) for m in merges]}}
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>"}))
    return folder


def run_builder(python: str, config: Path, gguf: Path, out: Path, workdir: Path) -> dict:
    """The builder on the file: its figures, or its refusal (the last line of its error)."""
    command = [python, "-m", "onnxruntime_genai.models.builder", "-m", str(config), "-i", str(gguf),
               "-o", str(out), "-p", "int4", "-e", "cpu", "-c", str(workdir / "genai-cache"),
               "--extra_options", "hf_token=false"]
    try:
        return {"command": " ".join(command), **measured(["env", "HF_HUB_OFFLINE=1", *command], out)}
    except RuntimeError as exc:
        lines = [line for line in str(exc).splitlines()  # less /usr/bin/time's lines
                 if line.strip() and not line.startswith("Command exited")][:-1]
        return {"command": " ".join(command), "error_tail": "\n".join(lines[-12:]),
                "refusal": next((line for line in reversed(lines) if not line.startswith(" ")), "")}


# -- the parent ---------------------------------------------------------------------------------
def child(step: str, *args: str) -> list[str]:
    return [sys.executable, __file__, "--step", step, *args]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gguf", type=Path, default=Path("/work/bench/moe/qwen3-30b-a3b-q4_0.gguf"))
    parser.add_argument("--shape", default="qwen3-30b-a3b", choices=sorted(SHAPES),
                        help="the file's shape (for --write and the builder's config)")
    parser.add_argument("--write", action="store_true", help="write the file (Q4_0) when it is missing")
    parser.add_argument("--workdir", type=Path, default=Path("/work/bench/moe/scale"))
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--verify", action=argparse.BooleanOptionalAction, default=False,
                        help="verify the export against PyTorch (export_onnx's verify)")
    parser.add_argument("--skip", nargs="*", default=[], choices=STEPS)
    parser.add_argument("--builder-python", default="/work/bench/genai-builder-venv/bin/python")
    parser.add_argument("--step", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--args", nargs="*", default=[], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.step == "export":
        gguf, out, verify, result = args.args
        return step_export(gguf, out, verify == "1", result)
    if args.step == "generate":
        kind, target, prompt, new_tokens, result = args.args
        return step_generate(kind, target, json.loads(Path(prompt).read_text()), int(new_tokens), result)

    args.workdir.mkdir(parents=True, exist_ok=True)
    if not args.gguf.exists():
        if not args.write:
            parser.error(f"{args.gguf} does not exist (--write writes it)")
        write_moe_gguf(args.gguf, args.shape, "Q4_0", progress=True)
    from llama_cpp import Llama
    from llama_cpp import __version__ as llama_version

    prompt = Llama(model_path=str(args.gguf), vocab_only=True, verbose=False).tokenize(
        PROMPT.encode(), add_bos=False)
    prompt_file = args.workdir / "prompt.json"
    prompt_file.write_text(json.dumps(prompt))
    out = args.workdir / "kit-int4"
    started, load = datetime.now(UTC), os.getloadavg()
    results: dict[str, dict] = {}

    def figures_path(name: str) -> Path:
        return args.workdir / f"{name.replace(' ', '-').replace(',', '')}.json"

    def run(name: str, command: list[str], folder: Path) -> None:
        figures_file = figures_path(name)
        figures_file.unlink(missing_ok=True)
        print(f"{name} ...", file=sys.stderr, flush=True)
        try:
            figures = measured(command, folder)
        except RuntimeError as exc:
            results[name] = {"failed": str(exc)[-2000:]}
        else:
            own = json.loads(figures_file.read_text()) if figures_file.exists() else {}
            results[name] = {**figures, **own}
        shown = {k: v for k, v in results[name].items() if k not in ("tokens", "report")}
        print(f"{name}: {json.dumps(shown)}", file=sys.stderr, flush=True)

    empty = args.workdir / "empty"  # measured() sizes a folder: none for these steps
    if "kit export" not in args.skip:
        shutil.rmtree(out, ignore_errors=True)
        run("kit export", child("export", "--args", str(args.gguf), str(out), str(int(args.verify)),
                                str(figures_path("kit export"))), out)
    if "kit generate" not in args.skip and (out / "manifest.json").exists():
        run("kit generate", child("generate", "--args", "kit", str(out), str(prompt_file),
                                  str(args.new_tokens), str(figures_path("kit generate"))), empty)
    for name, env in (("llama.cpp", []), ("llama.cpp, OMP passive", ["env", "OMP_WAIT_POLICY=PASSIVE"])):
        if name not in args.skip:
            run(name, [*env, *child("generate", "--args", "llama.cpp", str(args.gguf), str(prompt_file),
                                    str(args.new_tokens), str(figures_path(name)))], empty)
    if "genai int4" not in args.skip:
        if Path(args.builder_python).exists():
            print("genai int4 ...", file=sys.stderr, flush=True)
            results["genai int4"] = run_builder(args.builder_python, config_folder(args.workdir, args.shape),
                                                args.gguf, args.workdir / "genai-int4", args.workdir)
        else:
            results["genai int4"] = {"not_run": f"{args.builder_python} does not exist"}

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    shape = SHAPES[args.shape]
    summary = {"date": f"{started:%Y-%m-%d %H:%M} UTC", "cpu": cpu, "cores": os.cpu_count(),
               "memory_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
               "load_average": [load[0], os.getloadavg()[0]], "threads": THREADS,
               "command": " ".join(["python", *sys.argv]), "llama_cpp_python": llama_version,
               "gguf": {"path": str(args.gguf), "bytes": args.gguf.stat().st_size, "shape": args.shape,
                        "parameters": shape.parameters(), "active_parameters": shape.active_parameters()},
               "prompt_tokens": len(prompt), "new_tokens": args.new_tokens, "steps": results}
    (args.workdir / "moe_scale.json").write_text(json.dumps(summary, indent=1))
    print(f"\n{summary['date']}, {cpu}, {os.cpu_count()} cores, {summary['memory_bytes'] / 2**30:.0f} GiB "
          f"(load average {load[0]:.1f} before, {os.getloadavg()[0]:.1f} after), {THREADS} threads"
          f"\n    {summary['command']}\n{args.gguf.name}: {args.gguf.stat().st_size / 1e9:.2f} GB, "
          f"{shape.parameters() / 1e9:.1f}B parameters, {shape.active_parameters() / 1e9:.2f}B read per "
          f"token; prompt {len(prompt)} tokens + {args.new_tokens} new\n")
    print("| step | wall s | peak RSS GB | folder GB | load s | tokens/s | note |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for name, r in results.items():
        def num(key: str, scale: float = 1, digits: int = 1, r: dict = r) -> str:
            return f"{r[key] / scale:.{digits}f}" if isinstance(r.get(key), (int, float)) else ""
        note = r.get("not_run") or r.get("refusal") or (r.get("failed", "").splitlines() or [""])[-1]
        if "int4_matrices" in r:
            note = f"{r['int4_from_file_blocks']} of {r['int4_matrices']} from the file's blocks"
        print(f"| {name} | {num('seconds')} | {num('rss', 1e9, 2)} | "
              f"{num('folder', 1e9, 2) if name in ('kit export', 'genai int4') else ''} | "
              f"{num('load_seconds')} | {num('tokens_per_s', 1, 2)} | {note} |")
    print(f"\nresults: {args.workdir / 'moe_scale.json'}")


if __name__ == "__main__":
    main()
