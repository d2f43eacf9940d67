"""Forward latency: a BERT-shaped encoder against optimum and PyTorch, and the paper's
encoder-decoder against PyTorch with its share of onnxruntime's MatMul peak.

- BERT shape: d_model 512, 6 layers, 8 heads, d_ff 2048, vocabulary 30522, batch 4 x 128. A
  random BertModel checkpoint (save_pretrained) is loaded by transformer-kit's ``from_hf`` and
  exported; optimum (``pip install -e ".[bench]"``) exports the same checkpoint as
  ORTModelForFeatureExtraction.
- Paper: the built-in ``paper.yaml`` (d_model 512, 6+6 layers, vocabulary 37000), batch 4,
  64 source + 64 target tokens, full forward to logits.

    python benchmarks/forward.py [--rounds 15] [--workdir bench-work]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from importlib import resources
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # testbed/: helpers the benchmarks share

import transformer_kit as tk
from testbed.peers import bert_checkpoint
from transformer_kit.apps.benchmark import (
    Runner,
    exported,
    forward_flops,
    interleaved,
    matmul_peak_probe,
    onnx_runner_name,
    random_prompts,
    ratio_to,
)
from transformer_kit.apps.commands.bench import optimum_version


def _table(title: str, timings, baseline: str, extra=None) -> None:
    print(f"\n{title}")
    print("| runtime | ms per forward | vs baseline (time) | " + (extra[0] if extra else "") + " |")
    print("| --- | --- | --- |" + (" --- |" if extra else ""))
    for t in timings:
        ratio = 1 / ratio_to(timings, baseline, t.name)
        cell = f" {extra[1](t)} |" if extra else ""
        print(f"| {t.name} | {1e3 * t.median:.1f} | {ratio:.2f}x |{cell}")


def bert(workdir: Path, rounds: int) -> None:
    import transformers

    checkpoint = bert_checkpoint(workdir / "bert-shape")
    model = tk.from_hf(checkpoint)
    om = exported(model, workdir / "bert-transformer-kit-onnx")
    ids = random_prompts(model.config.vocab_size, 4, 128, {0, 101, 102}, seed=1)
    ids_np = ids.numpy()
    hf = transformers.BertModel.from_pretrained(checkpoint, add_pooling_layer=False).eval()

    def kit_eager():
        with torch.inference_mode():
            return model(ids)

    def hf_eager():
        with torch.inference_mode():
            return hf(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state

    runners = [Runner("transformer-kit, PyTorch eager", kit_eager),
               Runner(onnx_runner_name(om),
                      lambda: om(ids_np)),
               Runner(f"transformers {transformers.__version__}, PyTorch eager", hf_eager)]
    try:
        from optimum.onnxruntime import ORTModelForFeatureExtraction
    except ImportError:
        ORTModelForFeatureExtraction = None
    if ORTModelForFeatureExtraction is not None:
        folder = workdir / "bert-optimum"
        if not (folder / "model.onnx").exists():
            ORTModelForFeatureExtraction.from_pretrained(checkpoint, export=True).save_pretrained(folder)
        ort_model = ORTModelForFeatureExtraction.from_pretrained(folder)
        feeds = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
                 "token_type_ids": torch.zeros_like(ids)}
        runners.append(Runner(f"{optimum_version()}, onnxruntime",
                              lambda: ort_model(**feeds).last_hidden_state))
    timings, _ = interleaved(runners, rounds, progress=lambda s: print(s, file=sys.stderr), settle=True)
    reference = timings[2].result.numpy()

    def agreement(t) -> str:
        out = np.asarray(t.result)
        return f"{np.abs(out - reference).max() / np.abs(reference).max():.1e}"

    _table("BERT shape (d_model 512, 6 layers, d_ff 2048), batch 4 x 128, "
           f"{torch.get_num_threads()} threads, {rounds} rounds", timings, timings[0].name,
           ("max relative difference to transformers", agreement))
    kit_ort, hf_eager = timings[1].name, timings[2].name
    print(f"\ntransformer-kit onnxruntime time / transformers eager time: "
          f"{1 / ratio_to(timings, hf_eager, kit_ort):.2f}x")
    if len(timings) > 3:
        print(f"transformer-kit onnxruntime time / optimum time (median of per-round ratios): "
              f"{1 / ratio_to(timings, timings[3].name, kit_ort):.3f}x")


def paper(workdir: Path, rounds: int) -> None:
    config = resources.files("transformer_kit") / "configs" / "paper.yaml"
    torch.manual_seed(0)
    model = tk.build_model(str(config)).eval()
    om = exported(model, workdir / "paper-transformer-kit-onnx")
    cfg = model.config
    avoid = {cfg.pad_id, cfg.bos_id, *cfg.eos_ids}
    src = random_prompts(cfg.src_vocab, 4, 64, avoid, seed=2)
    tgt = random_prompts(cfg.tgt_vocab, 4, 64, avoid, seed=3)
    flops = forward_flops(model, src, tgt)

    def eager():
        with torch.inference_mode():
            return model(src, tgt)

    src_np, tgt_np = src.numpy(), tgt.numpy()
    runners = [Runner("transformer-kit, PyTorch eager", eager),
               Runner(onnx_runner_name(om),
                      lambda: om(src_np, tgt_np))]
    timings, probes = interleaved(runners, rounds, {"peak": matmul_peak_probe()},
                                  progress=lambda s: print(s, file=sys.stderr), settle=True)
    peaks = probes["peak"]

    def share(t) -> str:
        values = [flops / s / p for s, p in zip(t.seconds, peaks, strict=True)]
        return f"{flops / t.median / 1e9:.0f} GFLOP/s, {statistics.median(values):.0%} of peak"

    _table(f"Paper encoder-decoder, batch 4, 64 + 64 tokens, {flops / 1e9:.1f} GFLOP per forward; "
           f"onnxruntime MatMul peak (median) {statistics.median(peaks) / 1e9:.0f} GFLOP/s",
           timings, timings[0].name, ("throughput", share))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--only", choices=["bert", "paper"], default=None)
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="tk-bench-"))
    if args.only in (None, "bert"):
        bert(workdir, args.rounds)
    if args.only in (None, "paper"):
        paper(workdir, args.rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
