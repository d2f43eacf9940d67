"""int8 dynamic quantization: greedy tokens per second and top-1 agreement with float32.

The GPT-2-shaped checkpoint of ``generation.py`` is exported twice (float32 and
``quantize="int8"``). Speed: batch 1, 16 + 64 tokens, interleaved rounds with PyTorch eager as
the baseline. Agreement: the next token (argmax of the last position's logits) of float32 and
int8 onnxruntime on random prompts, plus PyTorch's float32 as a check of the float32 export.
A second row uses the trained digit-reversal model of ``transformer-kit demo`` (its logits have
real margins, unlike a random model's), when ``--demo`` points at its saved model.

    python benchmarks/int8.py [--rounds 15] [--prompts 500] [--workdir bench-work] [--demo DIR]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # testbed/: helpers the benchmarks share

import transformer_kit as tk
from testbed.peers import gpt2_checkpoint
from transformer_kit.apps.benchmark import Runner, exported, interleaved, random_prompts, ratio_to


def next_token_agreement(fp32, int8, model, vocab: int, avoid: set[int], prompts: int,
                         length: int) -> tuple[float, float]:
    """(int8 vs float32 onnxruntime, float32 onnxruntime vs PyTorch) top-1 agreement."""
    ids = random_prompts(vocab, prompts, length, avoid, seed=7)
    ids_np = ids.numpy()
    first32, first8 = [], []
    for start in range(0, prompts, 50):
        first32.append(fp32(ids_np[start:start + 50])[:, -1].argmax(-1))
        first8.append(int8(ids_np[start:start + 50])[:, -1].argmax(-1))
    with torch.inference_mode():
        reference = model(ids)[:, -1].argmax(-1).numpy()
    a32, a8 = np.concatenate(first32), np.concatenate(first8)
    return float((a8 == a32).mean()), float((a32 == reference).mean())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--prompts", type=int, default=500)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--demo", type=Path, default=None, help="a model saved by transformer-kit demo")
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="tk-bench-"))
    model = tk.from_hf(gpt2_checkpoint(workdir / "gpt2-shape"), pad_id=0)
    fp32 = exported(model, workdir / "transformer-kit-onnx")
    int8 = exported(model, workdir / "transformer-kit-onnx-int8", quantize="int8")
    cfg = model.config
    avoid = {0, cfg.bos_id, *cfg.eos_ids}
    ids = random_prompts(cfg.vocab_size, 1, 16, avoid)
    ids_np = ids.numpy()

    def eager():
        with torch.inference_mode():
            return model.generate(ids, max_new_tokens=64)

    count = lambda out: int(np.asarray(out).size)  # noqa: E731
    runners = [Runner("transformer-kit, PyTorch eager, float32", eager, count),
               Runner("transformer-kit, onnxruntime, float32", lambda: fp32.generate(ids_np, 64), count),
               Runner("transformer-kit, onnxruntime, int8", lambda: int8.generate(ids_np, 64), count)]
    timings, _ = interleaved(runners, args.rounds, progress=lambda s: print(s, file=sys.stderr))
    sizes = {name: sum(f.stat().st_size for f in (workdir / name).glob("*.onnx"))
             for name in ("transformer-kit-onnx", "transformer-kit-onnx-int8")}
    print(f"\nGPT-2 shape, batch 1, 16 + 64 tokens, {torch.get_num_threads()} threads, "
          f"{args.rounds} rounds; graphs {sizes['transformer-kit-onnx'] / 1e6:.0f} MB (float32), "
          f"{sizes['transformer-kit-onnx-int8'] / 1e6:.0f} MB (int8)")
    print("| runtime | tokens/s | vs baseline |")
    print("| --- | --- | --- |")
    for t in timings:
        print(f"| {t.name} | {t.tokens_per_s:.1f} | {ratio_to(timings, timings[0].name, t.name):.2f}x |")
    same = np.mean(np.asarray(timings[2].result) == np.asarray(timings[1].result))
    print(f"\nGreedy tokens of the timed prompt equal between int8 and float32: {same:.0%} of 64")
    print("\n| model | prompts | top-1 agreement int8 vs float32 | float32 onnxruntime vs PyTorch |")
    print("| --- | --- | --- | --- |")
    int8_agree, fp32_agree = next_token_agreement(fp32, int8, model, cfg.vocab_size, avoid,
                                                  args.prompts, 16)
    print(f"| GPT-2 shape, random weights | {args.prompts} x 16 tokens | {int8_agree:.1%} | "
          f"{fp32_agree:.1%} |")
    if args.demo is not None:
        demo = tk.load_model(args.demo)
        d32 = exported(demo, workdir / "demo-onnx")
        d8 = exported(demo, workdir / "demo-onnx-int8", quantize="int8")
        dcfg = demo.config
        avoid_demo = {dcfg.pad_id, dcfg.bos_id, *dcfg.eos_ids}
        src = random_prompts(dcfg.src_vocab, args.prompts, 8, avoid_demo, seed=3)
        agree = np.mean(d8.generate(src.numpy(), 8) == d32.generate(src.numpy(), 8))
        print(f"| demo digit reversal (trained), greedy tokens | {args.prompts} x 8 digits | "
              f"{agree:.1%} | - |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
