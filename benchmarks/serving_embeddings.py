"""Serving embeddings under load: ``transformer-kit serve`` of an embedding model's export,
1 to 64 concurrent clients posting ``/v1/embeddings``, against one request at a time.

An all-MiniLM-L6-v2-shaped sentence-transformers folder (random weights, written by
``benchmarks/embeddings.py``; ``--small``: its tiny shape) is exported in float32 and served by
``transformer-kit serve`` in a process of its own on 127.0.0.1. For each concurrency, that many
client threads each post requests of ``--inputs`` texts (``--lengths``: ~12, 8 to 256 or ~200
tokens) until
``--requests`` are answered (default: four per client, at least 64); reported: sentences/s of
all clients, the ratio to one client, request latency p50 / p99, and the most requests the
server ran in one call (its cross-client batching, from ``/metrics``). Then the server's RSS
over ``--memory-requests`` requests at 16 clients.

    pip install -e ".[serve,dev]"
    python benchmarks/serving_embeddings.py [--clients 1 16 64] [--inputs 1] [--memory-requests 2000]
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np

import transformer_kit as tk
from transformer_kit.export import export_onnx

HERE = Path(__file__).parent


def _sibling(name: str):
    """A benchmark script next to this one, as a module (the folder model, the server helpers)."""
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load(url: str, clients: int, requests: int, bodies: list[dict]) -> dict:
    """``clients`` threads post until ``requests`` are answered; aggregate numbers."""
    lock, taken, latencies, sentences = threading.Lock(), [0], [], [0]

    def client_loop() -> None:
        with httpx.Client(timeout=600) as client:
            while True:
                with lock:
                    if taken[0] == requests:
                        return
                    body = bodies[taken[0] % len(bodies)]
                    taken[0] += 1
                start = time.perf_counter()
                response = client.post(f"{url}/v1/embeddings", json=body)
                response.raise_for_status()
                with lock:
                    latencies.append(time.perf_counter() - start)
                    sentences[0] += len(response.json()["data"])

    threads = [threading.Thread(target=client_loop) for _ in range(clients)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - start
    return {"clients": clients, "sentences_per_s": sentences[0] / wall, "wall_s": wall,
            "p50_ms": 1e3 * np.percentile(latencies, 50), "p99_ms": 1e3 * np.percentile(latencies, 99)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--requests", type=int, default=None,
                        help="answered per concurrency level (default: 4 per client, at least 64)")
    parser.add_argument("--inputs", type=int, default=1, help="texts per request")
    parser.add_argument("--lengths", choices=["short", "mixed", "long"], default="mixed",
                        help="texts of ~12, 8 to 256, or ~200 tokens")
    parser.add_argument("--memory-requests", type=int, default=2000)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--small", action="store_true", help="the tiny shape (smoke test)")
    args = parser.parse_args(argv)
    embeddings, serving = _sibling("embeddings"), _sibling("serving")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="tk-serving-embeddings-"))
    shape = "tiny" if args.small else "minilm"
    folder = embeddings.write_checkpoint(workdir / shape, shape)
    export_onnx(tk.from_hf(folder), workdir / "onnx")
    pool = embeddings.texts(args.lengths, 512, embeddings.vocab_size(shape))
    bodies = [{"model": "bench", "encoding_format": "base64",
               "input": [pool[(i * args.inputs + j) % len(pool)] for j in range(args.inputs)]}
              for i in range(256)]
    tokens = {"short": "~12", "mixed": "8 to 256", "long": "~200"}[args.lengths]
    print(f"{embeddings.SHAPES[shape]['title']}, float32, {args.inputs} text(s) of {tokens} tokens "
          f"per request, {args.requests or 'max(64, 4 x clients)'} requests per level")
    with serving.server(workdir / "onnx", 64, 4 * max(args.clients) + 64) as (url, process):
        load(url, 4, 16, bodies)  # warm-up
        rows = []
        for clients in args.clients:
            row = load(url, clients, args.requests or max(64, 4 * clients), bodies)
            row["max_batch"] = serving.largest_batch(url)  # the most so far: levels only grow
            rows.append(row)
            print(f"  {clients} clients: {row['sentences_per_s']:.0f} sentences/s", file=sys.stderr)
        base = rows[0]["sentences_per_s"]
        print("\n| clients | sentences/s (all clients) | vs one at a time | request latency p50 / p99 "
              "(ms) | most requests in one call so far |")
        print("| --- | --- | --- | --- | --- |")
        for r in rows:
            print(f"| {r['clients']} | {r['sentences_per_s']:.0f} | {r['sentences_per_s'] / base:.2f}x | "
                  f"{r['p50_ms']:.1f} / {r['p99_ms']:.1f} | {r['max_batch']} |")
        if args.memory_requests:
            marks, done = [], 0
            step = max(args.memory_requests // 10, 1)
            start_rss = serving.rss(process.pid)
            while done < args.memory_requests:
                load(url, 16, step, bodies)
                done += step
                marks.append((done, serving.rss(process.pid)))
            print(f"\nserver RSS over {args.memory_requests} requests (16 clients): start "
                  f"{start_rss / 1e6:.0f} MB; " + ", ".join(f"{n}: {b / 1e6:.0f} MB" for n, b in marks))
            print(f"growth from the first tenth to the end: {(marks[-1][1] - marks[0][1]) / 1e6:+.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
