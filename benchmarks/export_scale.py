"""Exporting checkpoints of real models' sizes: transformer-kit against onnxruntime-genai's builder.

A random bfloat16 checkpoint in a published shape (``testbed/random_checkpoints.py``:
Qwen2.5-0.5B by default, Llama-3.1-8B with ``--shape llama-3.1-8b``) is written shard by shard,
with a small tokenizer (the builder copies one). Then each exporter runs in a process of its own,
timed and measured by ``/usr/bin/time`` (wall seconds, peak resident memory), in rounds:

- ``transformer-kit export CKPT --from-hf --quantize int4`` (verified against PyTorch, the
  default) and with ``--no-verify``; ``transformer-kit export CKPT --from-hf --no-verify`` (float32);
- onnxruntime-genai's builder ``-p int4 -e cpu`` and ``-p fp32 -e cpu`` (in a venv of its own
  where this environment's transformers cannot import it, as ``benchmarks/genai.py``).

Prints each figure's median and the ratios to genai's int4 build, and the folders' bytes.

    pip install -e ".[bench]"
    python benchmarks/export_scale.py [--shape qwen2.5-0.5b] [--rounds 1] [--workdir bench-export]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # testbed/: helpers the benchmarks share

from testbed.genai_peer import _builder_python, write_tokenizer
from testbed.random_checkpoints import SHAPES, write_random_checkpoint

SPECIAL_IDS = {"qwen2.5-0.5b": (151643, 151645), "llama-3.1-8b": (128000, 128001),
               "llama-100m": (1, 2)}


def checkpoint(workdir: Path, shape: str) -> tuple[Path, int]:
    """The random bfloat16 checkpoint of ``shape`` with a tokenizer, written once."""
    folder = workdir / f"{shape}-bf16"
    if not (folder / "config.json").exists():
        write_random_checkpoint(folder, shape)
        config = json.loads((folder / "config.json").read_text())
        config["bos_token_id"], config["eos_token_id"] = SPECIAL_IDS[shape]
        (folder / "config.json").write_text(json.dumps(config, indent=2))
        write_tokenizer(folder, 1000)  # the builder copies a tokenizer
    weights = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    return folder, weights


def measured(command: list[str], out: Path) -> dict[str, float]:
    """Run ``command`` (writing ``out``) under /usr/bin/time: wall seconds, peak RSS bytes,
    the folder's bytes."""
    shutil.rmtree(out, ignore_errors=True)
    result = subprocess.run(["/usr/bin/time", "-f", "%e %M", *command], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{result.stderr[-3000:]}")
    seconds, kilobytes = result.stderr.strip().splitlines()[-1].split()
    folder = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    return {"seconds": float(seconds), "rss": int(kilobytes) * 1024, "folder": folder}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="qwen2.5-0.5b", choices=sorted(SHAPES))
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--workdir", type=Path, default=Path("bench-export"))
    parser.add_argument("--skip", nargs="*", default=[], help="runner names to leave out")
    parser.add_argument("--builder-python", help="an interpreter that imports onnxruntime_genai's builder "
                        "(default: this one, or a venv made in the workdir)")
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    folder, weight_bytes = checkpoint(args.workdir, args.shape)
    kit = [sys.executable, "-m", "transformer_kit", "export", str(folder), "--from-hf"]
    genai = not {"genai int4", "genai fp32"} <= set(args.skip)
    python = (args.builder_python or _builder_python(args.workdir)) if genai else "python"
    builder = [python, "-m", "onnxruntime_genai.models.builder",
               "-i", str(folder), "-e", "cpu", "-c", str(args.workdir / "genai-cache")]
    out = args.workdir / "out"
    runners = {
        "kit int4 verified": [*kit, "--quantize", "int4", "-o", str(out / "kit-int4")],
        "kit int4 --no-verify": [*kit, "--quantize", "int4", "--no-verify", "-o", str(out / "kit-int4")],
        "genai int4": [*builder, "-p", "int4", "-o", str(out / "genai-int4")],
        "kit float32 --no-verify": [*kit, "--no-verify", "-o", str(out / "kit-fp32")],
        "genai fp32": [*builder, "-p", "fp32", "-o", str(out / "genai-fp32")],
    }
    runners = {name: command for name, command in runners.items() if name not in args.skip}
    results: dict[str, list[dict[str, float]]] = {name: [] for name in runners}
    for round_number in range(args.rounds):
        for name, command in runners.items():
            results[name].append(measured(command, Path(command[command.index("-o") + 1])))
            figures = results[name][-1]
            print(f"round {round_number + 1} {name:24s} {figures['seconds']:7.1f} s  "
                  f"{figures['rss'] / 1e9:6.2f} GB peak  {figures['folder'] / 1e6:8.0f} MB", flush=True)
    medians = {name: {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
               for name, rounds in results.items()}
    print(f"\n{args.shape}: bfloat16 checkpoint {weight_bytes / 1e9:.2f} GB, {args.rounds} round(s), medians")
    base = medians.get("genai int4")
    for name, figures in medians.items():
        ratios = "" if base is None else (
            f"  ({figures['seconds'] / base['seconds']:.2f}x time, {figures['rss'] / base['rss']:.2f}x peak, "
            f"{figures['folder'] / base['folder']:.2f}x folder of genai int4)")
        print(f"{name:24s} {figures['seconds']:7.1f} s  {figures['rss'] / 1e9:6.2f} GB peak  "
              f"{figures['folder'] / 1e6:8.0f} MB{ratios}")


if __name__ == "__main__":
    main()
