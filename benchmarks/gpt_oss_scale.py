"""gpt-oss at scale on the CPU: transformer-kit's streamed int4 export against onnxruntime-genai's
builder, on a checkpoint in the Hub's MXFP4 layout.

The checkpoint is a folder in openai/gpt-oss-20b's layout: a real download, or a random one that
``testbed/random_gpt_oss.py`` writes shard by shard (``--write SHAPE`` writes it here first:
``20b`` is gpt-oss-20b's shape, 13.8 GB; ``small`` 4 layers, hidden 768, 8 experts; ``tiny``
for the test). Each step runs in a process of its own under ``/usr/bin/time -v`` (wall
seconds, peak resident memory):

1. kit export: ``tk.from_hf(folder, stream=True)`` (the weights stay on disk) and
   ``export_onnx(model, out, quantize=Int4(), verify=False)`` (each MoE layer an onnxruntime
   QMoE): seconds, peak RSS, the folder's bytes;
2. kit run: ``OnnxModel(out)`` on the CPU with ``--threads`` intra-op threads: load seconds,
   resident memory after loading, then greedy ``--new-tokens`` tokens after a ``--prompt``-id
   prompt (exactly that many: eos may not end them; a 2-token warm-up first, then 3 timed
   calls), tokens per second over the median call (the prompt's prefill included), peak RSS;
3. genai build: onnxruntime-genai's builder ``-p int4 -e cpu`` on the same folder (in its own
   venv, ``--builder-python``): seconds, peak RSS, bytes, or its refusal (the end of its stderr);
4. genai run: if it built a model, ``og.Model`` load and the same greedy tokens with
   onnxruntime_genai in that venv (``intra_op_num_threads`` set to ``--threads`` in its
   genai_config.json).

A failed step is recorded (its exit status and the end of its stderr), never fatal. Writes
``gpt_oss_scale.json`` and ``gpt_oss_scale.md`` (a table, the date, the machine, the versions) to
``--workdir`` and prints the table.

onnxruntime-genai's builder loads the model with transformers first, whose MXFP4 quantizer
needs accelerate; where its venv lacks it, ``--genai-without-quantization-config`` hands it links
to the same shards with the quantization_config dropped (it reads the MXFP4 experts itself).
``--max-rss`` stops a step that outgrows a shared machine.

    python benchmarks/gpt_oss_scale.py --write small --workdir /work/bench/gptoss/small \\
        --genai-without-quantization-config
    python benchmarks/gpt_oss_scale.py --folder /work/bench/gptoss/gpt-oss-20b-shape \\
        --workdir /work/bench/gptoss/run-20b --genai-without-quantization-config --max-rss 20
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # testbed/: helpers the benchmarks share

#: Timed generations per run (after a warm-up); tokens/s is the median's.
REPEATS = 3
DEFAULT_BUILDER_PYTHON = "/work/bench/genai-builder-venv/bin/python"
SHAPES: dict[str, dict[str, int]] = {
    "20b": {},
    "small": {"layers": 4, "hidden": 768, "heads": 12, "kv_heads": 4, "head_dim": 64, "experts": 8,
              "top_k": 4, "intermediate": 768, "vocab": 32000},
    "tiny": {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "head_dim": 16, "experts": 4,
             "top_k": 2, "intermediate": 96, "vocab": 512, "sliding_window": 4},
}

# -- the children: each step's own process -------------------------------------------------------


def _rss() -> int:
    """This process's resident bytes now."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _prompt(length: int, vocab: int) -> list[int]:
    """A fixed short prompt of ids below 1000 and below the special tokens (16 before the end of
    a small vocabulary)."""
    return [(37 * i + 11) % min(1000, vocab - 16) for i in range(length)]


def child_kit_export(folder: str, out: str) -> dict[str, Any]:
    import transformer_kit as tk
    from transformer_kit.export import export_onnx
    from transformer_kit.export.quantize import Int4

    start = time.perf_counter()
    model = tk.from_hf(folder, stream=True)
    loaded = time.perf_counter()
    export_onnx(model, out, quantize=Int4(), verify=False)
    return {"load_seconds": loaded - start, "export_seconds": time.perf_counter() - loaded}


def child_kit_run(out: str, new_tokens: int, prompt: str, threads: int) -> dict[str, Any]:
    import numpy as np
    import onnxruntime as ort

    from transformer_kit.runtime import OnnxModel

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    start = time.perf_counter()
    model = OnnxModel(out, providers="cpu", session_options=options)
    load = time.perf_counter() - start
    rss = _rss()
    ids = np.array([[int(i) for i in prompt.split(",")]], dtype=np.int64)
    model.generate(ids, 2, min_new_tokens=2, do_sample=False)  # warm-up
    seconds = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        tokens = model.generate(ids, new_tokens, min_new_tokens=new_tokens, do_sample=False)
        seconds.append(time.perf_counter() - start)
    median = sorted(seconds)[len(seconds) // 2]
    return {"load_seconds": load, "rss_after_load": rss, "new_tokens": int(tokens.shape[1]),
            "generate_seconds": seconds, "tokens_per_second": tokens.shape[1] / median,
            "tokens": tokens[0].tolist()}


#: Run by the builder's interpreter (onnxruntime_genai, no transformer_kit): argv folder, new
#: tokens, prompt ids (comma-separated); prints one JSON line.
GENAI_RUN = """
import json, sys, time
import numpy as np
import onnxruntime_genai as og
folder, new, ids = sys.argv[1], int(sys.argv[2]), [int(i) for i in sys.argv[3].split(",")]
REPEATS = int(sys.argv[4])
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
start = time.perf_counter()
model = og.Model(folder)
load = time.perf_counter() - start
after = rss()
def generate(n):
    params = og.GeneratorParams(model)
    # the cache's capacity is max_length, and a sliding layer's must hold its window (128)
    params.set_search_options(max_length=max(len(ids) + n, 256), min_length=len(ids) + n,
                              do_sample=False, batch_size=1)
    generator = og.Generator(model, params)
    generator.append_tokens(np.array([ids], dtype=np.int32))
    while len(generator.get_sequence(0)) < len(ids) + n:
        generator.generate_next_token()
    return list(generator.get_sequence(0))[len(ids):]
generate(2)
seconds = []
for _ in range(REPEATS):
    start = time.perf_counter()
    tokens = generate(new)
    seconds.append(time.perf_counter() - start)
median = sorted(seconds)[len(seconds) // 2]
print(json.dumps({"load_seconds": load, "rss_after_load": after, "new_tokens": len(tokens),
                  "generate_seconds": seconds, "tokens_per_second": len(tokens) / median,
                  "tokens": [int(t) for t in tokens]}))
"""

def unquantized_config_view(folder: Path, out: Path) -> Path:
    """A folder of links to ``folder``'s files (the same MXFP4 shards) whose config.json lacks
    the quantization_config: the builder loads the model with transformers, whose MXFP4
    quantizer needs accelerate (absent from the builder's venv), then reads the MXFP4 experts
    itself from the safetensors index; without the quantization_config transformers leaves
    the experts' parameters initialized (random) instead, which the builder never uses."""
    out.mkdir(parents=True, exist_ok=True)
    for path in folder.iterdir():
        target = out / path.name
        if path.name != "config.json" and not target.exists():
            target.symlink_to(path.resolve())
    config = json.loads((folder / "config.json").read_text())
    config.pop("quantization_config", None)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


# -- the parent: steps measured ------------------------------------------------------------------


def _folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def _tree_rss(pid: int) -> int:
    """Resident bytes of process ``pid`` and its descendants now (0 once it is gone)."""
    total, pending = 0, [pid]
    while pending:
        current = pending.pop()
        try:
            total += int(Path(f"/proc/{current}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            pending += [int(c) for c in Path(f"/proc/{current}/task/{current}/children").read_text().split()]
        except (OSError, ValueError, IndexError):
            continue
    return total


def measured(command: list[str], log: Path, env: dict[str, str] | None = None,
             max_rss: float | None = None) -> dict[str, Any]:
    """Run ``command`` under ``/usr/bin/time -v``: its wall seconds, peak RSS bytes, exit
    status, the JSON its last stdout line printed (a child's figures) or the end of its stderr
    (a refusal). Both streams are kept in ``log``. With ``max_rss`` (bytes), the process group
    is killed once its resident memory passes that (on a machine shared with other jobs, a
    step that would not fit is stopped before the kernel's OOM killer picks a victim)."""
    stdout, stderr = log.with_suffix(".out"), log.with_suffix(".err")
    with stdout.open("w") as out, stderr.open("w") as err:
        process = subprocess.Popen(["/usr/bin/time", "-v", *command], stdout=out, stderr=err,
                                   env={**os.environ, **(env or {})}, start_new_session=True)
        killed = None
        while process.poll() is None:
            if max_rss is not None and (rss := _tree_rss(process.pid)) > max_rss:
                killed = (f"stopped by the benchmark: resident memory {rss / 1e9:.1f} GB passed "
                          f"{max_rss / 1e9:.1f} GB")
                os.killpg(process.pid, 9)
                process.wait()
                break
            time.sleep(0.5)
    result = subprocess.CompletedProcess(command, process.returncode, stdout.read_text(), stderr.read_text())
    stdout.unlink()
    stderr.unlink()
    log.write_text(f"$ {' '.join(command)}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}")
    peak = re.search(r"Maximum resident set size \(kbytes\): (\d+)", result.stderr)
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", result.stderr)
    seconds = None
    if wall:
        parts = [float(p) for p in wall.group(1).split(":")]
        seconds = sum(p * 60 ** (len(parts) - 1 - k) for k, p in enumerate(parts))
    figures: dict[str, Any] = {"ok": result.returncode == 0 and killed is None,
                               "returncode": result.returncode,
                               "wall_seconds": seconds,
                               "peak_rss": int(peak.group(1)) * 1024 if peak else None}
    if figures["ok"]:
        lines = [line for line in result.stdout.strip().splitlines() if line.startswith("{")]
        figures.update(json.loads(lines[-1]) if lines else {})
    else:
        errors = [line for line in result.stderr.splitlines() if not line.startswith(("\t", "Command "))]
        figures["error"] = "\n".join([*errors[-15:], *([killed] if killed else [])])
    return figures


def _versions(builder_python: str | None) -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in ("transformer-kit", "torch", "onnxruntime", "transformers", "safetensors"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    if builder_python and Path(builder_python).exists():
        probe = subprocess.run([builder_python, "-c", "import onnxruntime_genai as og, onnxruntime as o, "
                                "transformers as t; print(og.__version__, o.__version__, t.__version__)"],
                               capture_output=True, text=True)
        if probe.returncode == 0:
            og, ort, hf = probe.stdout.split()
            versions.update({"onnxruntime-genai (builder venv)": og, "onnxruntime (builder venv)": ort,
                             "transformers (builder venv)": hf})
    return versions


def _machine() -> dict[str, Any]:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    memory = next(int(line.split()[1]) * 1024 for line in Path("/proc/meminfo").read_text().splitlines()
                  if line.startswith("MemTotal:"))
    return {"host": platform.node(), "cpu": cpu, "cores": os.cpu_count(), "memory_bytes": memory,
            "system": platform.platform(), "python": platform.python_version()}


def _shape(config: dict[str, Any]) -> str:
    return (f"{config['num_hidden_layers']} layers, hidden {config['hidden_size']}, "
            f"{config['num_attention_heads']}/{config['num_key_value_heads']} heads of {config['head_dim']}, "
            f"{config['num_local_experts']} experts (top {config['num_experts_per_tok']}) of "
            f"{config['intermediate_size']}, vocab {config['vocab_size']}")


def run(args: argparse.Namespace) -> dict[str, Any]:
    workdir: Path = args.workdir
    workdir.mkdir(parents=True, exist_ok=True)
    folder: Path = args.folder or workdir / f"gpt-oss-{args.write}"
    if args.write and not (folder / "model.safetensors.index.json").exists():
        from testbed.random_gpt_oss import gpt_oss_config, write_random_gpt_oss

        start = time.perf_counter()
        write_random_gpt_oss(folder, gpt_oss_config(**SHAPES[args.write]))
        print(f"wrote {folder} in {time.perf_counter() - start:.1f} s", flush=True)
    config = json.loads((folder / "config.json").read_text())
    me = [sys.executable, str(Path(__file__).resolve())]
    prompt = ",".join(map(str, _prompt(args.prompt, config["vocab_size"])))
    builder = args.builder_python
    report: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": _machine(), "versions": _versions(None if "genai" in args.skip else builder),
        "checkpoint": {"folder": str(folder), "shape": _shape(config),
                       "weights_bytes": sum(p.stat().st_size for p in folder.glob("*.safetensors"))},
        "settings": {"max_rss_gb": args.max_rss, "threads": args.threads, "new_tokens": args.new_tokens,
                     "prompt_tokens": args.prompt},
        "steps": {},
    }
    steps = report["steps"]
    logs = workdir / "logs"
    logs.mkdir(exist_ok=True)

    def step(name: str, command: list[str], out: Path | None = None, **kw: Any) -> dict[str, Any]:
        print(f"{name} ...", flush=True)
        steps[name] = measured(command, logs / f"{name.replace(' ', '-')}.log",
                               max_rss=args.max_rss * 1e9 if args.max_rss else None, **kw)
        if out is not None:
            steps[name]["folder_bytes"] = _folder_bytes(out)
        print(f"  {json.dumps({k: v for k, v in steps[name].items() if k != 'tokens'})}", flush=True)
        return steps[name]

    if "kit" not in args.skip:
        kit_out = workdir / "kit-int4"
        shutil.rmtree(kit_out, ignore_errors=True)
        if step("kit export", [*me, "--child", "kit-export", str(folder), str(kit_out)], kit_out)["ok"]:
            step("kit run", [*me, "--child", "kit-run", str(kit_out), str(args.new_tokens), prompt,
                             str(args.threads)])
    if "genai" not in args.skip:
        genai_out = workdir / "genai-int4"
        shutil.rmtree(genai_out, ignore_errors=True)
        source = folder
        if args.genai_without_quantization_config:
            source = unquantized_config_view(folder, workdir / "without-quantization-config")
            report["genai_input"] = (f"{source} (links to the same shards; config.json without "
                                     "quantization_config)")
        build = step("genai build", [builder, "-m", "onnxruntime_genai.models.builder", "-i", str(source),
                                     "-o", str(genai_out), "-p", "int4", "-e", "cpu",
                                     "-c", str(workdir / "genai-cache")], genai_out,
                     env={"PYTHONWARNINGS": "ignore"})
        shutil.rmtree(workdir / "genai-cache", ignore_errors=True)
        genai_config = genai_out / "genai_config.json"
        if build["ok"] and genai_config.exists():
            data = json.loads(genai_config.read_text())
            data["model"]["decoder"].setdefault("session_options", {})["intra_op_num_threads"] = args.threads
            genai_config.write_text(json.dumps(data, indent=4))
            step("genai run", [builder, "-c", GENAI_RUN, str(genai_out), str(args.new_tokens),
                               prompt, str(REPEATS)])
    kit, genai = steps.get("kit run", {}), steps.get("genai run", {})
    if kit.get("ok") and genai.get("ok"):
        report["same_tokens"] = kit["tokens"] == genai["tokens"]
    (workdir / "gpt_oss_scale.json").write_text(json.dumps(report, indent=2))
    table = markdown(report)
    (workdir / "gpt_oss_scale.md").write_text(table)
    print(table)
    return report


def _gb(value: float | None) -> str:
    return "" if value is None else f"{value / 1e9:.2f} GB"


def _s(value: float | None) -> str:
    return "" if value is None else f"{value:.1f} s"


def markdown(report: dict[str, Any]) -> str:
    """The report as a markdown table, the date, machine and versions above it."""
    m, c, s = report["machine"], report["checkpoint"], report["settings"]
    lines = [f"# gpt-oss at scale ({report['date']})", "",
             f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_bytes'] / 2**30:.0f} GiB ({m['host']}).  ",
             f"Checkpoint: {c['folder']} ({c['shape']}; {_gb(c['weights_bytes'])} of safetensors).  ",
             f"Generation: {s['new_tokens']} greedy tokens after {s['prompt_tokens']} prompt ids, "
             f"{s['threads']} threads; tokens/s over the median of {REPEATS} calls (prefill included).  ",
             "Versions: " + ", ".join(f"{k} {v}" for k, v in report["versions"].items() if v), "",
             "| step | status | wall | peak RSS | folder | load | RSS after load | tokens/s |",
             "|---|---|---|---|---|---|---|---|"]
    for name, f in report["steps"].items():
        status = "ok"
        if not f["ok"]:
            last = (f.get("error") or "").strip().splitlines()
            status = f"failed ({f['returncode']}): {last[-1][:150] if last else ''}".replace("|", "/")
        seconds = f.get("wall_seconds")
        tps = f.get("tokens_per_second")
        lines.append(f"| {name} | {status} | {_s(seconds)} | {_gb(f.get('peak_rss'))} | "
                     f"{_gb(f.get('folder_bytes')) if f.get('folder_bytes') else ''} | "
                     f"{_s(f.get('load_seconds'))} | "
                     f"{_gb(f.get('rss_after_load'))} | {'' if tps is None else f'{tps:.2f}'} |")
    if "genai_input" in report:
        lines += ["", f"onnxruntime-genai's builder read {report['genai_input']}."]
    if "same_tokens" in report:
        lines += ["", f"Same greedy tokens from both: {report['same_tokens']}."]
    return "\n".join(lines) + "\n"


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        kind, rest = sys.argv[2], sys.argv[3:]
        if kind == "kit-export":
            figures = child_kit_export(*rest)
        else:
            figures = child_kit_run(rest[0], int(rest[1]), rest[2], int(rest[3]))
        print(json.dumps(figures))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--folder", type=Path, help="a checkpoint folder in gpt-oss's Hub layout")
    source.add_argument("--write", choices=sorted(SHAPES), help="write a random checkpoint of this shape "
                        "into the workdir first (once)")
    parser.add_argument("--workdir", type=Path, default=Path("bench-gpt-oss"))
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--prompt", type=int, default=16, help="prompt length in ids")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--skip", nargs="*", default=[], choices=["kit", "genai"])
    parser.add_argument("--genai-without-quantization-config", action="store_true",
                        help="give the builder links to the same shards with config.json's "
                        "quantization_config dropped (its transformers refuses MXFP4 without accelerate)")
    parser.add_argument("--max-rss", type=float, help="GB: stop a step whose processes' resident "
                        "memory passes this (recorded as its failure)")
    parser.add_argument("--builder-python", default=DEFAULT_BUILDER_PYTHON,
                        help="an interpreter with onnxruntime-genai's builder and onnxruntime_genai")
    run(parser.parse_args())


if __name__ == "__main__":
    main()
