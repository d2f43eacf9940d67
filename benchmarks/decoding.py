"""Beam search and sampling against greedy decoding, and against transformers and optimum.

The GPT-2-shaped checkpoint of ``benchmarks/generation.py`` (d_model 512, 6 layers, vocabulary
8000), one 16-token prompt, exactly ``--new-tokens`` new tokens for every runner
(``min_new_tokens`` = ``max_new_tokens``), timed in interleaved rounds:

- greedy, sampling (temperature 0.8, top-k 50, top-p 0.9) and beam search (4 beams) in
  transformer-kit's onnxruntime and PyTorch runtimes;
- beam search (4 beams) in transformers (PyTorch) and optimum (onnxruntime, where installed);
- greedy at batch 4 (four copies of the prompt): the same 4 rows per step as 4 beams, so
  "beam / greedy x4" is the cost of beam search's bookkeeping and cache reorder per step;
- the cache reorder alone: one gather of every layer's keys and values for 4 rows.

    python benchmarks/decoding.py [--rounds 10] [--new-tokens 32] [--workdir bench-work]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # testbed/: helpers the benchmarks share

import transformer_kit as tk
from testbed.peers import gpt2_checkpoint
from transformer_kit.apps.benchmark import Runner, exported, interleaved, random_prompts, ratio_to
from transformer_kit.apps.commands.bench import load_optimum_causal_lm, optimum_version

SAMPLING = {"do_sample": True, "temperature": 0.8, "top_k": 50, "top_p": 0.9, "seed": 0}
BEAMS = {"num_beams": 4, "early_stopping": True}


def kit_runners(model, om, ids: torch.Tensor, new: int) -> list[Runner]:
    fixed = {"max_new_tokens": new, "min_new_tokens": new}
    ids_np = ids.numpy()
    four = np.repeat(ids_np, 4, axis=0)

    def torch_call(**options):
        def run():
            with torch.inference_mode():
                return model.generate(ids, **fixed, **options)
        return run

    count = lambda out: int(out.shape[1])  # noqa: E731 - new tokens of the first row
    return [
        Runner("kit onnxruntime, greedy", lambda: om.generate(ids_np, **fixed), count),
        Runner("kit onnxruntime, sampling", lambda: om.generate(ids_np, **fixed, **SAMPLING), count),
        Runner("kit onnxruntime, greedy x4 rows", lambda: om.generate(four, **fixed), count),
        Runner("kit onnxruntime, 4 beams", lambda: om.generate(ids_np, **fixed, **BEAMS), count),
        Runner("kit PyTorch, greedy", torch_call(), count),
        Runner("kit PyTorch, sampling", torch_call(**SAMPLING), count),
        Runner("kit PyTorch, 4 beams", torch_call(**BEAMS), count),
    ]


def peer_runners(checkpoint: Path, workdir: Path, ids: torch.Tensor, new: int) -> list[Runner]:
    import transformers

    options = {"max_new_tokens": new, "min_new_tokens": new, "attention_mask": torch.ones_like(ids),
               "pad_token_id": 0, "do_sample": False, **BEAMS}
    hf = transformers.AutoModelForCausalLM.from_pretrained(checkpoint).eval()

    def hf_beams():
        with torch.inference_mode():
            return hf.generate(ids, **options)[:, ids.shape[1]:]

    count = lambda out: int(out.shape[1])  # noqa: E731
    runners = [Runner(f"transformers {transformers.__version__} PyTorch, 4 beams", hf_beams, count)]
    optimum = load_optimum_causal_lm(checkpoint, workdir)
    if optimum is not None:
        runners.append(Runner(f"{optimum_version()} onnxruntime, 4 beams",
                              lambda: optimum.generate(ids, **options)[:, ids.shape[1]:], count))
    return runners


def reorder_seconds(om, ids: np.ndarray, past: int, calls: int = 200) -> float:
    """Median seconds of one cache reorder for 4 rows after ``past`` positions."""
    stepper, _, _ = om._plan(np.repeat(ids, 4, axis=0), None,
                             tk.GenerationConfig(max_new_tokens=past), None)
    stepper.first()
    for _ in range(past - ids.shape[1]):
        stepper.next(np.zeros(4, np.int64), None)
    rows = np.array([1, 0, 3, 3])
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        stepper._reorder(rows)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="tk-bench-"))
    checkpoint = gpt2_checkpoint(workdir / "gpt2-shape")
    model = tk.from_hf(checkpoint)
    om = exported(model, workdir / "transformer-kit-onnx")
    cfg = model.config
    ids = random_prompts(cfg.vocab_size, 1, args.prompt_len, {0, cfg.bos_id, *cfg.eos_ids})
    runners = kit_runners(model, om, ids, args.new_tokens)
    runners += peer_runners(checkpoint, workdir, ids, args.new_tokens)
    timings, _ = interleaved(runners, args.rounds, progress=lambda t: print(t, file=sys.stderr),
                             settle=True)
    by_name = {t.name: t for t in timings}
    kit_beams = by_name["kit onnxruntime, 4 beams"].result
    print(f"\nGPT-2 shape, 1 prompt of {args.prompt_len} tokens, {args.new_tokens} new tokens, "
          f"{torch.get_num_threads()} threads, {args.rounds} rounds")
    print("| runner | new tokens/s | ms/step | vs kit onnxruntime greedy | vs kit onnxruntime 4 beams |"
          " same best beam |")
    print("| --- | --- | --- | --- | --- | --- |")
    for t in timings:
        same = "-"
        if "beams" in t.name:
            same = "yes" if np.array_equal(np.asarray(t.result)[0], np.asarray(kit_beams)[0]) else "no"
        print(f"| {t.name} | {t.tokens_per_s:.1f} | {1e3 / t.tokens_per_s:.2f} | "
              f"{ratio_to(timings, 'kit onnxruntime, greedy', t.name):.2f}x | "
              f"{ratio_to(timings, 'kit onnxruntime, 4 beams', t.name):.2f}x | {same} |")
    beam_vs_four = ratio_to(timings, "kit onnxruntime, 4 beams", "kit onnxruntime, greedy x4 rows")
    sampling = ratio_to(timings, "kit onnxruntime, sampling", "kit onnxruntime, greedy")
    torch_sampling = ratio_to(timings, "kit PyTorch, sampling", "kit PyTorch, greedy")
    print(f"\nbeam step / greedy step at 4 rows (onnxruntime): {beam_vs_four:.3f}")
    print(f"sampling / greedy time per step: onnxruntime {sampling:.3f}, PyTorch {torch_sampling:.3f}")
    past = args.prompt_len + args.new_tokens
    print(f"cache reorder alone, 4 rows x {past} positions, all layers: "
          f"{reorder_seconds(om, ids.numpy(), past) * 1e3:.3f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
