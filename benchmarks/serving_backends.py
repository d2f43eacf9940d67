"""Serving through Triton and Ray Serve against the one-process server, on the same model and load.

The GPT-2-shaped checkpoint of ``benchmarks/serving.py`` (d_model 512, 6 layers, vocabulary
8000; ``--small``: a tiny one), exported in float32, served three ways at once on 127.0.0.1,
each in processes of its own:

- ``local``: ``transformer-kit serve`` (one process, continuous batching), OpenAI streaming;
- ``ray``: ``transformer-kit serve --ray --replicas 2`` (a local Ray instance, Ray's proxy
  spreading requests over two replicas, each with its own engine), OpenAI streaming;
- ``triton``: ``transformer-kit triton`` repository on the ``tritonserver`` of the
  nvidia-pytriton wheel (the Python backend's decoupled generate model, whose engine batches),
  HTTP ``generate_stream`` with ``input_ids``.

For each round and each number of clients the servers take turns (interleaved, so drift hits
them alike), each with that many client threads streaming requests (a 16-token prompt,
``--new-tokens`` greedy tokens) until ``--requests`` are answered. Reported: the medians over
rounds of tokens/s and their ratio to ``local`` in the same round, with time to first token.
The idle servers stay up meanwhile (Ray's processes take a little CPU while idle).

    pip install -e ".[serve,serve-ray,bench]" && pip install --no-deps nvidia-pytriton==0.7.0
    python benchmarks/serving_backends.py [--clients 1 16] [--rounds 3] [--backends local ray triton]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # testbed/: helpers the benchmarks share

import transformer_kit as tk
from testbed import triton_local
from testbed.peers import gpt2_checkpoint
from transformer_kit.apps.benchmark import exported
from transformer_kit.apps.serving.triton import write_repository

sys.path.insert(0, str(Path(__file__).parent))
from serving import load, server


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def ray_server(folder: Path, replicas: int, max_batch: int, max_queue: int):
    """``transformer-kit serve --ray`` on a new local Ray instance; yields the base URL. Stopped
    with SIGINT (the command shuts Ray Serve and Ray down), killed if it does not end."""
    port = _port()
    command = [sys.executable, "-m", "transformer_kit", "serve", str(folder), "--ray", "--replicas",
               str(replicas), "--port", str(port), "--model-name", "bench", "--max-batch", str(max_batch),
               "--max-queue", str(max_queue), "--provider", "cpu"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "RAY_AUTH_MODE": "disabled"}
    process = subprocess.Popen(command, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the Ray Serve server did not start")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/v1/models", timeout=5).status_code == 200:
                    break
            time.sleep(1)
        yield url
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(90)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(30)


def triton_stream(client: httpx.Client, url: str, prompt: list[int], new: int
                  ) -> tuple[float, list[float], int]:
    """One request to Triton's ``generate_stream``: (time to first token, gaps, tokens)."""
    body = {"input_ids": prompt, "max_new_tokens": new}
    start, stamps = time.perf_counter(), []
    with client.stream("POST", f"{url}/v2/models/bench_generate/generate_stream", json=body,
                       timeout=600) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data: "):
                event = json.loads(line[6:])
                if "error" in event:
                    raise RuntimeError(event["error"])
                stamps.append(time.perf_counter())
    return stamps[0] - start, list(np.diff(stamps)), len(stamps)


@contextlib.contextmanager
def triton_server(folder: Path, workdir: Path, max_batch: int):
    """The export's repository on the wheel's ``tritonserver``; yields the HTTP base URL."""
    env = triton_local.model_environment(workdir / "model-env")  # numpy<2 for this 24.10 stub
    write_repository(folder, workdir / "repo", "bench", max_batch=max_batch, env=env)
    with triton_local.local_server(workdir / "repo", ["bench_generate"], workdir / "server") as running:
        yield f"http://127.0.0.1:{running.http_port}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--requests", type=int, default=None,
                        help="answered per level and server (default: 4 per client, at least 32)")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-batch", type=int, default=64)
    parser.add_argument("--backends", nargs="+", default=["local", "ray", "triton"],
                        choices=["local", "ray", "triton"])
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--small", action="store_true", help="a tiny GPT-2 shape (smoke test)")
    args = parser.parse_args(argv)
    if "local" not in args.backends:
        parser.error("--backends needs local: the others are reported against it")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="tk-serving-backends-"))
    shape = {"vocab": 512, "d_model": 64, "layers": 2, "heads": 4} if args.small else {}
    checkpoint = gpt2_checkpoint(workdir / "gpt2-shape", **shape)
    model = exported(tk.from_hf(checkpoint), workdir / "onnx", providers="cpu")
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, model.manifest.src_vocab - 1, 16).tolist() for _ in range(256)]
    del model
    max_queue = 4 * max(args.clients) + 64
    print(f"GPT-2 shape {shape or 'd_model 512, 6 layers, vocab 8000'}, float32, greedy, "
          f"{args.new_tokens} new tokens after 16, max_batch {args.max_batch}, {args.rounds} rounds")
    with contextlib.ExitStack() as stack:
        urls = {"local": stack.enter_context(server(workdir / "onnx", args.max_batch, max_queue))[0]}
        if "ray" in args.backends:
            urls["ray"] = stack.enter_context(ray_server(workdir / "onnx", 2, args.max_batch, max_queue))
        if "triton" in args.backends:
            urls["triton"] = stack.enter_context(triton_server(workdir / "onnx", workdir / "triton",
                                                               args.max_batch))
        streamers = {"triton": triton_stream}
        kwargs = {name: {"streamer": streamers[name]} if name in streamers else {} for name in urls}
        for name, url in urls.items():  # warm-up: every replica and engine past its first runs
            load(url, 4, 16, prompts, args.new_tokens, **kwargs[name])
        results: dict[tuple[str, int], list[dict]] = {}
        for round_ in range(args.rounds):
            for clients in args.clients:
                requests = args.requests or max(32, 4 * clients)
                for name, url in urls.items():
                    row = load(url, clients, requests, prompts, args.new_tokens, **kwargs[name])
                    results.setdefault((name, clients), []).append(row)
                    print(f"  round {round_ + 1}, {clients} clients, {name}: "
                          f"{row['tokens_per_s']:.0f} tokens/s", file=sys.stderr)
    print("\n| server | clients | tokens/s (median of rounds) | vs local (median of rounds' ratios) "
          "| time to first token p50 (ms) |")
    print("| --- | --- | --- | --- | --- |")
    for clients in args.clients:
        local = [r["tokens_per_s"] for r in results[("local", clients)]]
        for name in urls:
            rows = results[(name, clients)]
            ratios = [r["tokens_per_s"] / base for r, base in zip(rows, local, strict=True)]
            print(f"| {name} | {clients} | {np.median([r['tokens_per_s'] for r in rows]):.0f} | "
                  f"{np.median(ratios):.2f}x | {np.median([r['ttft_p50_ms'] for r in rows]):.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
