"""Greedy generation at batch 1 against the memory-bandwidth limit, optimum and PyTorch.

A randomly initialised GPT-2-shaped checkpoint (d_model 512, 6 layers, 8 heads, d_ff 2048,
vocabulary 8000) is written with transformers' save_pretrained; transformer-kit loads it with
``from_hf`` and exports it; optimum (where installed: ``pip install -e ".[bench]"``) exports the
same checkpoint. All runners generate the same 64 greedy tokens from the same 16-token prompt,
in interleaved rounds with the bandwidth probe.

    python benchmarks/generation.py [--rounds 15] [--workdir bench-work]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # testbed/: helpers the benchmarks share

import transformer_kit as tk
from testbed.peers import gpt2_checkpoint
from transformer_kit.apps.benchmark import (
    exported,
    interleaved,
    kit_generation_runners,
    random_prompts,
    ratio_to,
    read_bandwidth_probe,
    weight_bytes_per_token,
    weight_stream_runner,
)
from transformer_kit.apps.commands.bench import hf_generation_runners


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--no-transformers", action="store_true", help="skip transformers' PyTorch run")
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="tk-bench-"))
    checkpoint = gpt2_checkpoint(workdir / "gpt2-shape")
    model = tk.from_hf(checkpoint, pad_id=0)
    om = exported(model, workdir / "transformer-kit-onnx")
    cfg = model.config
    ids = random_prompts(cfg.vocab_size, 1, args.prompt_len, {0, cfg.bos_id, *cfg.eos_ids})
    runners = kit_generation_runners(model, om, ids, args.new_tokens)
    runners += hf_generation_runners(checkpoint, workdir, ids, args.new_tokens,
                                     with_transformers=not args.no_transformers)
    runners.append(weight_stream_runner(model, args.new_tokens))
    probe = read_bandwidth_probe()
    timings, probes = interleaved(runners, args.rounds, {"bandwidth": probe},
                                  progress=lambda text: print(text, file=sys.stderr))
    weight_bytes = weight_bytes_per_token(model)
    baseline = timings[0].name
    reference = timings[1].result
    print(f"\nGPT-2 shape, batch 1, {args.prompt_len} + {args.new_tokens} tokens, "
          f"{torch.get_num_threads()} threads, {args.rounds} rounds")
    print(f"weights read per token: {weight_bytes / 1e6:.1f} MB; read bandwidth (median) "
          f"{statistics.median(probes['bandwidth']) / 1e9:.1f} GB/s")
    print("| runtime | tokens/s | ms/token | vs baseline | share of bandwidth bound | same tokens |")
    print("| --- | --- | --- | --- | --- | --- |")
    for t in timings:
        shares = [weight_bytes * t.tokens / s / bw
                  for s, bw in zip(t.seconds, probes["bandwidth"], strict=True)]
        if isinstance(t.result, int):
            same = "-"
        else:
            same = "yes" if bool((torch.as_tensor(t.result) == torch.as_tensor(reference)).all()) else "no"
        print(f"| {t.name} | {t.tokens_per_s:.1f} | {1e3 / t.tokens_per_s:.2f} | "
              f"{ratio_to(timings, baseline, t.name):.2f}x | {statistics.median(shares):.0%} | {same} |")
    bandwidth = probes["bandwidth"]
    print(f"\nread bandwidth per round: min {min(bandwidth) / 1e9:.1f}, median "
          f"{statistics.median(bandwidth) / 1e9:.1f}, max {max(bandwidth) / 1e9:.1f} GB/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
