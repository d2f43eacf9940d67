"""GPTQ against the kit's calibrated scale search, on the real SmolLM2-135M-Instruct: does
GPTQ's error feedback let more of the weights stay in 4 bits at the same perplexity?

The kit's int4 (``Int4()``) chooses each block's scale by least squares, each column's error
weighed by its mean squared input over the calibration text (the diagonal of the input's second
moment, llama.cpp's importance matrix); its default when this ran kept the embedding (tied head)
and down projections in 8 bits (``eight_bit=("embedding", "down")``, the rows here). GPTQ
(Frantar et al., 2022) uses the whole second moment H = E[x x^T]: it rounds one column at a
time and moves the rounding error onto the columns not yet rounded, through the Cholesky factor
of H^-1. Here it runs with the kit's blocks (32 weights,
symmetric), each block's scale chosen by the kit's search on the weights as they stand when the
block is reached (its columns weighed by the dampened H's diagonal), H from the same
calibration text (``export/calibration.txt``, 2,048 tokens), in the float32 model (not layer by
layer).

Perplexity is measured in PyTorch (transformers) with the weights replaced by their dequantized
values (float activations: about 0.004 below the level-4 figures of ``int4_quality.py``), on
the held text of ``int4_quality.py`` (the first 4,096 tokens of ``pydoc_data.topics``, windows
of 512). Also printed: each method's value of GPTQ's own objective, tr((W - Q) H (W - Q)^T),
for three matrices, with H from the calibration text and from held text.

    python benchmarks/int4_gptq.py [--workdir bench-int4q] [--damp 0.01 0.1 1.0]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # testbed/: helpers the benchmarks share
sys.path.insert(0, str(Path(__file__).resolve().parent))

from int4_quality import held_text

from transformer_kit.export.calibration import DEFAULT_TEXT, FLOOR
from transformer_kit.export.int4_nodes import dequantize_rows, quantize_rows, search_blocks

BLOCK = 32
WINDOW = 512


def second_moments(model, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """E[x x^T] (K, K) float64 of every Linear's input over ``ids`` (tokens,), windows of 512."""
    sums, counts, hooks = {}, {}, []
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            def hook(_, inputs, name=name):
                x = inputs[0].detach().reshape(-1, inputs[0].shape[-1]).double()
                sums[name] = sums.get(name, 0) + x.T @ x
                counts[name] = counts.get(name, 0) + len(x)
            hooks.append(module.register_forward_pre_hook(hook))
    with torch.no_grad():
        for start in range(0, len(ids), WINDOW):
            model(ids[None, start:start + WINDOW])
    for hook in hooks:
        hook.remove()
    return {name: sums[name] / counts[name] for name in sums}


def perplexity(model, held: torch.Tensor) -> float:
    """exp(mean next-token loss) of ``model`` over ``held`` (4,097 ids), windows of 512."""
    nll, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, 4096, WINDOW):
            chunk = held[start:start + WINDOW + 1]
            logits = model(chunk[None, :-1]).logits[0].double()
            nll += torch.nn.functional.cross_entropy(logits, chunk[1:], reduction="sum").item()
            count += len(chunk) - 1
    return float(np.exp(nll / count))


def importance(h: torch.Tensor) -> np.ndarray:
    """The kit's calibrated column weights: the diagonal of H plus FLOOR of its mean."""
    d = torch.diagonal(h).float().numpy()
    return d + FLOOR * d.mean()


def searched(w: torch.Tensor, bits: int, h: torch.Tensor, block: int = BLOCK,
             symmetric: bool = True) -> torch.Tensor:
    """(N, K) ``w`` through the kit's calibrated search (columns weighed by H's diagonal), dequantized."""
    q = quantize_rows(w.numpy(), block, symmetric, bits=bits, rounding="search", importance=importance(h))
    return torch.from_numpy(dequantize_rows(q)[:, :w.shape[1]])


def gptq(w: torch.Tensor, h: torch.Tensor, damp: float, lazy: int = 128) -> torch.Tensor:
    """(N, K) ``w`` through GPTQ in symmetric 4-bit blocks of 32, dequantized."""
    weights, h = w.clone().double(), h.clone()
    k = weights.shape[1]
    dead = torch.diagonal(h) == 0
    h[dead, dead] = 1
    weights[:, dead] = 0
    h += damp * torch.diagonal(h).mean() * torch.eye(k, dtype=torch.float64)
    hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    column_weights = importance(h)
    out = torch.zeros_like(weights)
    scale = None
    for first in range(0, k, lazy):
        last = min(first + lazy, k)
        part, inv = weights[:, first:last].clone(), hinv[first:last, first:last]
        errors = torch.zeros(len(weights), last - first, dtype=torch.float64)
        for i in range(last - first):
            if (first + i) % BLOCK == 0:  # the block's scale from its weights as they stand now
                block = part[:, i:i + BLOCK].float().numpy()[:, None]
                _, scales, _ = search_blocks(block, 4, True, True,
                                             column_weights[first + i:first + i + BLOCK].reshape(1, 1, -1))
                scale = torch.from_numpy(scales[:, 0]).double()
            column = part[:, i]
            rounded = torch.clamp(torch.round(column / scale), -8, 7) * scale
            out[:, first + i] = rounded
            error = (column - rounded) / inv[i, i]
            part[:, i:] -= error[:, None] * inv[i, i:][None]
            errors[:, i] = error
        weights[:, last:] -= errors @ hinv[first:last, last:]
    return out.float()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, default=Path("bench-int4q"))
    parser.add_argument("--damp", type=float, nargs="+", default=[0.01, 0.1, 1.0])
    args = parser.parse_args(argv)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from testbed.peers import smollm2_checkpoint

    checkpoint = smollm2_checkpoint(args.workdir / "smollm2-hf")
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    original = {name: p.detach().clone() for name, p in model.named_parameters()}

    def encode(text: str) -> torch.Tensor:
        return torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"])

    held = encode(held_text())[:4097]
    calibration = encode(DEFAULT_TEXT.read_text(encoding="utf-8"))[:2048]
    moments = second_moments(model, calibration)
    held_moments = second_moments(model, held[4097 - 2048:])  # the held text's second half

    def quantized(method: str, eight_bit: tuple[str, ...], damp: float) -> float:
        start = time.perf_counter()
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(original[name])
            for name, module in model.named_modules():
                if isinstance(module, torch.nn.Linear) and name != "lm_head":
                    w = module.weight.detach()
                    if "down" in eight_bit and "down_proj" in name:
                        module.weight.copy_(searched(w, 8, moments[name]))
                    elif method == "gptq":
                        module.weight.copy_(gptq(w, moments[name], damp))
                    else:
                        module.weight.copy_(searched(w, 4, moments[name]))
            table = model.model.embed_tokens.weight  # the tied head reads it
            table.copy_(searched(table.detach(), 8 if "embedding" in eight_bit else 4, moments["lm_head"]))
        return time.perf_counter() - start

    reference = perplexity(model, held)
    print(f"float32: perplexity {reference:.3f}", flush=True)
    runs = [("search", ("embedding", "down"), 0.0), ("search", ("embedding",), 0.0)]
    runs += [("gptq", eight_bit, damp) for damp in args.damp
             for eight_bit in (("embedding",), ("embedding", "down"))]
    for method, eight_bit, damp in runs:
        seconds = quantized(method, eight_bit, damp)
        value = perplexity(model, held)
        label = f"{method}{f' damp {damp}' if method == 'gptq' else ''}, 8-bit {' and '.join(eight_bit)}"
        print(f"{label}: perplexity {value:.3f} = {value / reference:.4f}x float32 ({seconds:.0f} s)",
              flush=True)

    print("GPTQ's objective tr((W - Q) H (W - Q)^T), H of the calibration text / of held text:")
    for name in ("model.layers.3.self_attn.q_proj", "model.layers.3.mlp.down_proj",
                 "model.layers.10.mlp.up_proj"):
        w = original[f"{name}.weight"]

        def objective(q: torch.Tensor, h: torch.Tensor, w=w) -> float:
            d = (w - q).double()
            return float(torch.einsum("nk,kl,nl->", d, h, d))
        for label, q in (("search", searched(w, 4, moments[name])),
                         ("gptq damp 0.01", gptq(w, moments[name], 0.01))):
            print(f"  {name}, {label}: {objective(q, moments[name]):.3f} "
                  f"/ {objective(q, held_moments[name]):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
