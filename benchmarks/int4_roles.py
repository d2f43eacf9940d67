"""Which products of the real SmolLM2-135M-Instruct need 8 bits: perplexity of held text with the
token table (the tied embedding and head) and chosen products in 8-bit blocks, the rest in the
kit's calibrated 4-bit search; and two levers that did not pay (a 4-bit head; AWQ's scales).

Every row quantizes the float32 weights with the kit's own functions (symmetric blocks of 32,
each block's scale searched for the least squared error, each column weighed by its mean squared
input over the kit's calibration text, ``export/calibration.txt``, 2,048 tokens) and replaces
each weight by its dequantized values; perplexity is then measured in PyTorch (transformers, float
activations: a little below the level-4 figures of ``int4_quality.py``) on its held text (the
first 4,096 tokens of ``pydoc_data.topics``, windows of 512).

Rows: the 8-bit table alone; with the down projections of every layer (the kit's default before),
of the first 1, 2 or 4 layers, or of llama.cpp's ``use_more_bits`` layers (i < n/8, i >= 7n/8,
every third between); with every product of the first 1-4 layers (``Int4(eight_bit=("embedding",
"early"))``, the default, is the first eighth: 4 of SmolLM2's 30 layers); the attention or the
feed-forward of the first 2. Then the table's two sides apart (an 8-bit embedding with a 4-bit
head and the reverse), the head in 4-bit blocks of 16 or asymmetric, and AWQ (Lin et al., 2023):
each layer's q/k/v, gate/up and down inputs scaled by s = mean(x^2)^(alpha/2) per channel (the
weights multiplied by s, the inputs divided, exactly: a norm or the up projection can carry
1/s), alpha in 0..0.7 chosen per group for the least output error tr((W - Q) H (W - Q)^T) under
the calibration text's second moment H.

    python benchmarks/int4_roles.py [--workdir bench-int4q]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # testbed/: helpers the benchmarks share
sys.path.insert(0, str(Path(__file__).resolve().parent))

from int4_gptq import perplexity, searched, second_moments
from int4_quality import held_text

from transformer_kit.export.calibration import DEFAULT_TEXT
from transformer_kit.export.weight_writer import early_layers

AWQ_ALPHAS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7)


def output_error(w: torch.Tensor, q: torch.Tensor, h: torch.Tensor) -> float:
    d = (w - q).double()
    return float(torch.einsum("nk,kl,nl->", d, h, d))


def awq_searched(w: torch.Tensor, h: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """(N, K) ``w`` in 4 bits with its input columns scaled by ``s`` (K,) first (the inputs
    divided by it, so H by s s^T), dequantized and scaled back."""
    return searched((w * s).contiguous(), 4, h / torch.outer(s, s).double()) / s


def layer(name: str) -> int:
    return int(name.split(".")[2])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, default=Path("bench-int4q"))
    args = parser.parse_args(argv)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from testbed.peers import smollm2_checkpoint

    checkpoint = smollm2_checkpoint(args.workdir / "smollm2-hf")
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    original = {name: p.detach().clone() for name, p in model.named_parameters()}
    table = original["model.embed_tokens.weight"]
    linears = [name for name, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and name != "lm_head"]
    count = len(model.model.layers)

    def encode(text: str) -> torch.Tensor:
        return torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"])

    held = encode(held_text())[:4097]
    moments = second_moments(model, encode(DEFAULT_TEXT.read_text(encoding="utf-8"))[:2048])

    def quantized(eight: Callable[[str], bool], embedding: torch.Tensor, head: torch.Tensor,
                  scales: dict[str, torch.Tensor] | None = None) -> None:
        """Body products in 8 bits where ``eight`` says, else 4 (AWQ ``scales`` per input column)."""
        model.model.embed_tokens.weight = torch.nn.Parameter(embedding.clone())
        model.lm_head.weight = (model.model.embed_tokens.weight if head is embedding
                                else torch.nn.Parameter(head.clone()))
        with torch.no_grad():
            for name in linears:
                w, h = original[f"{name}.weight"], moments[name]
                module = model.get_submodule(name)
                if scales and name in scales and not eight(name):
                    module.weight.copy_(awq_searched(w, h, scales[name]))
                else:
                    module.weight.copy_(searched(w, 8 if eight(name) else 4, h))

    def awq_scales() -> dict[str, torch.Tensor]:
        chosen = {}
        for i in range(count):
            for group in ([f"model.layers.{i}.self_attn.{p}" for p in ("q_proj", "k_proj", "v_proj")],
                          [f"model.layers.{i}.mlp.{p}" for p in ("gate_proj", "up_proj")],
                          [f"model.layers.{i}.mlp.down_proj"]):
                h = moments[group[0]]
                size = torch.sqrt(torch.diagonal(h)).float() + 1e-8
                best = None
                for alpha in AWQ_ALPHAS:
                    s = size ** alpha
                    s = s / torch.sqrt(s.max() * s.min())
                    error = sum(output_error(w, awq_searched(w, h, s), h)
                                for w in (original[f"{n}.weight"] for n in group))
                    if best is None or error < best[0]:
                        best = (error, s)
                chosen.update(dict.fromkeys(group, best[1]))
        return chosen

    head_moment = moments["lm_head"]
    tables = {8: searched(table, 8, head_moment), 4: searched(table, 4, head_moment),
              "4, blocks of 16": searched(table, 4, head_moment, block=16),
              "4, asymmetric": searched(table, 4, head_moment, symmetric=False)}
    early = {i for _, i in early_layers([f"model.layers.{i}.x" for i in range(count)])}
    more_bits = {i for i in range(count)
                 if i < count // 8 or i >= 7 * count // 8 or (i - count // 8) % 3 == 2}

    def down(layers) -> Callable[[str], bool]:
        return lambda name: "down_proj" in name and layer(name) in layers

    every = range(count)
    rows = [("8-bit table", lambda name: False, 8, 8),
            ("8-bit table and every down projection (the default before)", down(every), 8, 8),
            ("8-bit table and the first layer's down projection", down({0}), 8, 8),
            ("8-bit table and the first 2 layers' down projections", down({0, 1}), 8, 8),
            ("8-bit table and the first 4 layers' down projections", down({0, 1, 2, 3}), 8, 8),
            (f"8-bit table and llama.cpp's use_more_bits layers' down projections ({len(more_bits)})",
             down(more_bits), 8, 8),
            ("8-bit table and every product of the first layer", lambda n: layer(n) < 1, 8, 8),
            ("8-bit table and every product of the first 2 layers", lambda n: layer(n) < 2, 8, 8),
            ("8-bit table and every product of the first 3 layers", lambda n: layer(n) < 3, 8, 8),
            (f"8-bit table and every product of the first eighth ({len(early)} layers: the default)",
             lambda n: layer(n) in early, 8, 8),
            ("8-bit table and the attention products of the first 2 layers",
             lambda n: layer(n) < 2 and "self_attn" in n, 8, 8),
            ("8-bit table and the feed-forward products of the first 2 layers",
             lambda n: layer(n) < 2 and "mlp" in n, 8, 8),
            ("8-bit embedding, 4-bit head", lambda name: False, 8, 4),
            ("4-bit embedding, 8-bit head", lambda name: False, 4, 8),
            ("4-bit table in blocks of 16", lambda name: False, "4, blocks of 16", "4, blocks of 16"),
            ("4-bit table, asymmetric", lambda name: False, "4, asymmetric", "4, asymmetric"),
            ("4-bit table in blocks of 16, the first eighth in 8 bits", lambda n: layer(n) in early,
             "4, blocks of 16", "4, blocks of 16"),
            ("4-bit table in blocks of 16, the first eighth and every down projection in 8 bits",
             lambda n: layer(n) in early or "down_proj" in n, "4, blocks of 16", "4, blocks of 16")]

    reference = perplexity(model, held)
    print(f"| weights (SmolLM2-135M-Instruct, {count} layers) | perplexity | vs float32 |")
    print("| --- | ---: | ---: |")
    print(f"| float32 | {reference:.3f} | 1.000x |", flush=True)
    for label, eight, embedding, head in rows:
        start = time.perf_counter()
        quantized(eight, tables[embedding], tables[head])  # one table object: tied
        value = perplexity(model, held)
        print(f"| {label} | {value:.3f} | {value / reference:.4f}x |", flush=True)
        print(f"  ({time.perf_counter() - start:.0f} s)", file=sys.stderr, flush=True)
    scales = awq_scales()
    for label, groups in (("8-bit table, AWQ scales on q/k/v, gate/up and down", ("self_attn", "mlp")),
                          ("8-bit table, AWQ scales on q/k/v and gate/up", ("q_proj", "k_proj", "v_proj",
                                                                           "gate_proj", "up_proj"))):
        quantized(lambda name: False, tables[8], tables[8],
                  {n: s for n, s in scales.items() if any(g in n for g in groups)})
        value = perplexity(model, held)
        print(f"| {label} | {value:.3f} | {value / reference:.4f}x |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
