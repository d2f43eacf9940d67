"""Serving under load: the OpenAI-compatible server with continuous batching, 1 to 64
concurrent streaming clients, against one request at a time.

A GPT-2-shaped checkpoint (d_model 512, 6 layers, vocabulary 8000; ``--small``: a tiny one) is
exported in float32 and served by ``transformer-kit serve`` in a process of its own on
127.0.0.1 (so the clients' Python does not share the server's interpreter). For each
concurrency, that many client threads each stream requests (a 16-token prompt,
``--new-tokens`` greedy tokens) until ``--requests`` have been answered (default: four per
client, at least 64, so each level runs past the first wave of prefills); reported: aggregate
tokens/s, its ratio to one client (one request at a time), time to first token and per-token
latency (gaps between streamed tokens) at p50 and p99, and the largest batch the engine ran.
Then ``--memory-requests`` short requests at 16 clients, with the server's RSS and the bytes its
prefix cache holds every tenth of the way. ``--no-batch-invariant`` serves without batch-invariant
decoding (rows join at any step; run both to see what the default costs).

    pip install -e ".[serve,bench]"
    python benchmarks/serving.py [--requests N] [--new-tokens 32] [--memory-requests 10000]
        [--no-batch-invariant]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # testbed/: helpers the benchmarks share

import transformer_kit as tk
from testbed.peers import gpt2_checkpoint
from transformer_kit.apps.benchmark import exported


def rss(pid: int) -> int:
    """Resident bytes of process ``pid`` now."""
    return int(re.search(r"VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text()).group(1)) * 1024


@contextlib.contextmanager
def server(folder: Path, max_batch: int = 16, max_queue: int = 64, options: tuple[str, ...] = ()):
    """``transformer-kit serve`` on a free port of 127.0.0.1 (``options``: more of its command
    line options); yields (base URL, process)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [sys.executable, "-m", "transformer_kit", "serve", str(folder), "--port", str(port),
               "--model-name", "bench", "--max-batch", str(max_batch), "--max-queue", str(max_queue),
               "--provider", "cpu", *options]
    process = subprocess.Popen(command, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    with running(process, f"{url}/health"):
        yield url, process


@contextlib.contextmanager
def running(process: subprocess.Popen, ready: str):
    """Wait (2 minutes at most) until GET ``ready`` answers 200, then until the block ends;
    ``process`` is stopped after it either way."""
    try:
        deadline = time.monotonic() + 120
        while True:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start: {' '.join(map(str, process.args))}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(ready).status_code == 200:
                    break
            time.sleep(0.2)
        yield
    finally:
        process.terminate()
        process.wait(30)


def metric(url: str, name: str) -> float:
    """The value of the server's /metrics sample ``name``."""
    text = httpx.get(f"{url}/metrics").text
    return float(re.search(rf"^{name} (\S+)$", text, re.M).group(1))


def largest_batch(url: str) -> int:
    return int(metric(url, "transformer_kit_max_batch_size"))


def stream(client: httpx.Client, url: str, prompt: list[int], new: int) -> tuple[float, list[float], int]:
    """One streamed completion: (time to first token, gaps between tokens, tokens)."""
    body = {"model": "bench", "prompt": prompt, "max_tokens": new, "temperature": 0, "stream": True}
    start, stamps = time.perf_counter(), []
    with client.stream("POST", f"{url}/v1/completions", json=body, timeout=600) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            event = json.loads(line[6:]) if line.startswith("data: {") else {}
            if "error" in event:
                raise RuntimeError(f"the server failed a request: {event['error']['message']}")
            if event and event["choices"][0]["token_ids"]:
                stamps.append(time.perf_counter())
    return stamps[0] - start, list(np.diff(stamps)), len(stamps)


def load(url: str, clients: int, requests: int, prompts: list[list[int]], new: int,
         streamer=stream) -> dict:
    """``clients`` threads stream until ``requests`` are answered; aggregate numbers (with each
    request's time from sending to its last token). ``streamer(client, url, prompt, new)``: one
    request, as :func:`stream`."""
    lock, taken, ttft, gaps, tokens, failures = threading.Lock(), [0], [], [], [0], []
    whole: list[float] = []

    def client_loop() -> None:
        try:
            answer_requests()
        except Exception as exc:  # raised again in the main thread, below
            failures.append(exc)

    def answer_requests() -> None:
        with httpx.Client() as client:
            while True:
                with lock:
                    if taken[0] == requests:
                        return
                    i = taken[0]
                    taken[0] += 1
                sent = time.perf_counter()
                first, between, count = streamer(client, url, prompts[i % len(prompts)], new)
                with lock:
                    whole.append(time.perf_counter() - sent)
                    ttft.append(first)
                    gaps.extend(between)
                    tokens[0] += count

    threads = [threading.Thread(target=client_loop) for _ in range(clients)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]
    wall = time.perf_counter() - start
    return {"clients": clients, "tokens_per_s": tokens[0] / wall, "tokens": tokens[0], "wall_s": wall,
            "ttft_p50_ms": 1e3 * np.percentile(ttft, 50), "ttft_p99_ms": 1e3 * np.percentile(ttft, 99),
            "token_p50_ms": 1e3 * np.percentile(gaps, 50) if gaps else float("nan"),
            "token_p99_ms": 1e3 * np.percentile(gaps, 99) if gaps else float("nan"),
            "request_p50_ms": 1e3 * np.percentile(whole, 50),
            "request_p99_ms": 1e3 * np.percentile(whole, 99)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--requests", type=int, default=None,
                        help="answered per concurrency level (default: 4 per client, at least 64)")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--memory-requests", type=int, default=10_000)
    parser.add_argument("--max-batch", type=int, default=64)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--small", action="store_true", help="a tiny GPT-2 shape (smoke test)")
    parser.add_argument("--no-batch-invariant", action="store_true",
                        help="serve with --no-batch-invariant (what batch-invariant decoding costs)")
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="tk-serving-"))
    shape = {"vocab": 512, "d_model": 64, "layers": 2, "heads": 4} if args.small else {}
    checkpoint = gpt2_checkpoint(workdir / "gpt2-shape", **shape)
    model = exported(tk.from_hf(checkpoint), workdir / "onnx", providers="cpu")
    vocab = model.manifest.src_vocab  # the export is served by another process below
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, vocab - 1, 16).tolist() for _ in range(256)]
    print(f"GPT-2 shape {shape or 'd_model 512, 6 layers, vocab 8000'}, float32, greedy, "
          f"{args.new_tokens} new tokens, {args.requests or 'max(64, 4 x clients)'} requests per level, "
          f"max_batch {args.max_batch}{', not batch invariant' if args.no_batch_invariant else ''}")
    options = ("--no-batch-invariant",) if args.no_batch_invariant else ()
    with server(workdir / "onnx", args.max_batch, 4 * max(args.clients) + 64, options) as (url, process):
        load(url, 4, 8, prompts, args.new_tokens)  # warm-up
        rows = []
        for clients in args.clients:
            row = load(url, clients, args.requests or max(64, 4 * clients), prompts, args.new_tokens)
            row["max_batch"] = largest_batch(url)  # the largest so far: levels only grow
            rows.append(row)
            print(f"  {clients} clients: {row['tokens_per_s']:.0f} tokens/s", file=sys.stderr)
        base = rows[0]["tokens_per_s"]
        print("\n| clients | tokens/s (all clients) | vs one at a time | time to first token p50 / p99 (ms) "
              "| per-token latency p50 / p99 (ms) | largest batch so far |")
        print("| --- | --- | --- | --- | --- | --- |")
        for r in rows:
            print(f"| {r['clients']} | {r['tokens_per_s']:.0f} | {r['tokens_per_s'] / base:.2f}x | "
                  f"{r['ttft_p50_ms']:.1f} / {r['ttft_p99_ms']:.1f} | {r['token_p50_ms']:.1f} / "
                  f"{r['token_p99_ms']:.1f} | {r['max_batch']} |")
        if args.memory_requests:
            marks, done = [], 0
            step = max(args.memory_requests // 10, 1)
            start_rss, held = rss(process.pid), [metric(url, "transformer_kit_prefix_cache_bytes")]
            while done < args.memory_requests:
                load(url, 16, step, prompts, 4)
                done += step
                marks.append((done, rss(process.pid)))
                held.append(metric(url, "transformer_kit_prefix_cache_bytes"))
            print(f"\nserver RSS over {args.memory_requests} requests (16 clients, 4 tokens each): start "
                  f"{start_rss / 1e6:.0f} MB; " + ", ".join(f"{n}: {b / 1e6:.0f} MB" for n, b in marks))
            print(f"growth from the first tenth to the end: {(marks[-1][1] - marks[0][1]) / 1e6:+.1f} MB")
            print(f"the prefix cache held (its entries' bytes, within the server's bound): start "
                  f"{held[0] / 1e6:.0f} MB; " + ", ".join(f"{n}: {b / 1e6:.0f} MB"
                                                        for (n, _), b in zip(marks, held[1:], strict=True)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
