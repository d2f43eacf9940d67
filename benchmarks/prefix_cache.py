"""Prefix caching in the server: time to first token for requests that share a long prefix (a
system prompt, few-shot examples) and end differently, with the prefix cache and without it.

A GPT-2-shaped checkpoint (d_model 512, 6 layers, vocabulary 8000; ``--small``: a tiny one) is
exported in float32 and served twice by ``transformer-kit serve`` on 127.0.0.1, each server in
a process of its own: one with ``--prefix-cache-bytes 0``, one with the default bound. Both get
one warm-up request with the shared prefix (``--prefix`` tokens; the cached server keeps it).
Then, after one round not counted, in ``--rounds`` interleaved rounds (without, with, without,
...), each server streams the same new prompts, the prefix and a distinct ending of ``--suffix``
tokens: one request alone, then ``--concurrent`` at once. Reported: median time to first token
of each, the median of the rounds' ratios (with / without), the cached tokens a reply's
``usage`` gives, and whether the greedy tokens (``--new-tokens``) of the two servers are equal.

    pip install -e ".[serve,bench]"
    python benchmarks/prefix_cache.py [--rounds 10] [--prefix 500] [--suffix 12] [--concurrent 4]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # testbed/: helpers the benchmarks share

import transformer_kit as tk
from testbed.peers import gpt2_checkpoint
from transformer_kit.apps.benchmark import exported

sys.path.insert(0, str(Path(__file__).parent))
from serving import server


def stream(url: str, prompt: list[int], new: int) -> tuple[float, list[int]]:
    """One streamed greedy completion: (seconds to its first token, its token ids)."""
    body = {"model": "bench", "prompt": prompt, "max_tokens": new, "temperature": 0, "stream": True}
    first, tokens = None, []
    with httpx.Client() as client:  # made before the clock starts (it reads CA certificates)
        start = time.perf_counter()
        with client.stream("POST", f"{url}/v1/completions", json=body, timeout=600) as response:
            response.raise_for_status()
            for line in response.iter_lines():
                if line.startswith("data: {"):
                    ids = json.loads(line[6:])["choices"][0]["token_ids"]
                    if ids and first is None:
                        first = time.perf_counter() - start
                    tokens += ids
    return first, tokens


def cached_tokens(url: str, prompt: list[int]) -> int:
    """The cached tokens a one-token completion of ``prompt`` reports in its usage."""
    body = {"model": "bench", "prompt": prompt, "max_tokens": 1, "temperature": 0}
    usage = httpx.post(f"{url}/v1/completions", json=body, timeout=600).json()["usage"]
    return usage["prompt_tokens_details"]["cached_tokens"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--prefix", type=int, default=500, help="tokens shared by every prompt")
    parser.add_argument("--suffix", type=int, default=12, help="tokens of each prompt's own ending")
    parser.add_argument("--new-tokens", type=int, default=8)
    parser.add_argument("--concurrent", type=int, default=4, help="requests sent at once per round")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--small", action="store_true", help="a tiny GPT-2 shape (smoke test)")
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="tk-prefix-"))
    shape = {"vocab": 512, "d_model": 64, "layers": 2, "heads": 4} if args.small else {}
    checkpoint = gpt2_checkpoint(workdir / "gpt2-shape", **shape)
    vocab = exported(tk.from_hf(checkpoint), workdir / "onnx", providers="cpu").manifest.src_vocab
    rng = np.random.default_rng(0)
    prefix = rng.integers(3, vocab - 1, args.prefix).tolist()

    def ending() -> list[int]:
        return rng.integers(3, vocab - 1, args.suffix).tolist()

    print(f"GPT-2 shape {shape or 'd_model 512, 6 layers, vocab 8000'}, float32, CPU, a {args.prefix}"
          f"-token shared prefix, {args.suffix}-token endings, {args.new_tokens} greedy new tokens, "
          f"{args.rounds} rounds")
    times: dict[tuple[str, bool], list[float]] = {}
    ratios: dict[str, list[float]] = {}  # per case, each round's median with / without
    same: dict[str, list[bool]] = {}  # per case: each request's tokens equal on both servers
    alone_case, together_case = "one request alone", f"{args.concurrent} requests at once"
    # the same server twice, the prefix cache off and at its default bound
    with server(workdir / "onnx", options=("--prefix-cache-bytes", "0")) as (plain, _), \
            server(workdir / "onnx") as (cache, _):
        urls = {False: plain, True: cache}
        for url in urls.values():  # warm-up: sessions, and the prefix into the cache
            stream(url, [*prefix, *ending()], args.new_tokens)
        for round_ in range(args.rounds + 1):  # round 0 warms the paths up, not counted
            alone = [*prefix, *ending()]
            together = [[*prefix, *ending()] for _ in range(args.concurrent)]
            tokens: dict[tuple[str, bool], list[list[int]]] = {}
            for with_cache, url in urls.items():  # interleaved: without, then with
                first, got = stream(url, alone, args.new_tokens)
                times.setdefault((alone_case, with_cache), []).append(first)
                tokens[alone_case, with_cache] = [got]
                with ThreadPoolExecutor(args.concurrent) as pool:
                    results = list(pool.map(lambda p, u=url: stream(u, p, args.new_tokens), together))
                times.setdefault((together_case, with_cache), []).extend(r[0] for r in results)
                tokens[together_case, with_cache] = [r[1] for r in results]
            if round_ == 0:
                times.clear()
                continue
            for case in (alone_case, together_case):
                count = 1 if case == alone_case else args.concurrent  # this round's times: the last
                with_it, without = (np.median(times[case, c][-count:]) for c in (True, False))
                ratios.setdefault(case, []).append(with_it / without)
                same.setdefault(case, []).extend(
                    a == b for a, b in zip(tokens[case, False], tokens[case, True], strict=True))
        cached = [cached_tokens(cache, [*prefix, *ending()]), cached_tokens(plain, [*prefix, *ending()])]
    print(f"\ncached tokens in a reply's usage: {cached[0]} with the cache, {cached[1]} without")
    print("\n| requests | time to first token without the cache, p50 (ms) | with it, p50 (ms) | "
          "with / without (median of the rounds' ratios) | greedy tokens equal |")
    print("| --- | --- | --- | --- | --- |")
    for case, equal in same.items():
        without, with_it = np.median(times[case, False]) * 1e3, np.median(times[case, True]) * 1e3
        print(f"| {case} | {without:.1f} | {with_it:.1f} | {np.median(ratios[case]):.2f}x | "
              f"{sum(equal)}/{len(equal)} |")
    return 0 if all(all(equal) for equal in same.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
