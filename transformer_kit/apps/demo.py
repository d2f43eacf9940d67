"""The main job end to end, on a built-in task: learn to reverse digit strings with the paper's
encoder-decoder (``demo.yaml`` beside this module), save it, export it to ONNX, and compare
greedy decoding in PyTorch and onnxruntime.

Tokens: 0 pad, 1 bos, 2 eos, 3..12 the digits 0..9. A source ``[d1 .. dn]`` has the target
``[dn .. d1, eos]``; training uses teacher forcing (the look-ahead mask trains every target
position at once) and the paper's Adam schedule with warm-up.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from torch import Tensor

from transformer_kit.core.assembly import build_model
from transformer_kit.core.model import EncoderDecoderTransformer

DEMO_CONFIG = Path(__file__).parent / "demo.yaml"
PAD, BOS, EOS, FIRST_DIGIT = 0, 1, 2, 3


@dataclass
class ReversalTask:
    """Random digit strings of ``min_len..max_len`` digits and their reversals."""

    min_len: int = 3
    max_len: int = 8

    def batch(self, size: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """(src (size, max_len), tgt (size, max_len + 1)): right-padded, tgt ends with eos."""
        lengths = torch.randint(self.min_len, self.max_len + 1, (size,), generator=generator)
        digits = torch.randint(FIRST_DIGIT, FIRST_DIGIT + 10, (size, self.max_len), generator=generator)
        src = torch.full((size, self.max_len), PAD)
        tgt = torch.full((size, self.max_len + 1), PAD)
        for row, n in enumerate(lengths.tolist()):
            src[row, :n] = digits[row, :n]
            tgt[row, :n] = digits[row, :n].flip(0)
            tgt[row, n] = EOS
        return src, tgt


def to_text(ids: Tensor | list[int]) -> str:
    """Digit tokens as a string; stops at eos, drops padding."""
    out = []
    for token in (ids.tolist() if isinstance(ids, Tensor) else ids):
        if token == EOS:
            break
        if token >= FIRST_DIGIT:
            out.append(str(token - FIRST_DIGIT))
    return "".join(out)


def exact_match(generated: Tensor, tgt: Tensor) -> float:
    """Share of rows whose generated string equals the target string."""
    return sum(to_text(g) == to_text(t) for g, t in zip(generated, tgt, strict=True)) / len(tgt)


def greedy_agreement(tokens, reference, eos_id: int) -> float:
    """Share of ``reference``'s tokens, up to and including each row's eos, that ``tokens``
    (same shape, (rows, steps)) repeats at the same position."""
    tokens, reference = np.asarray(tokens), np.asarray(reference)
    ended_before = np.cumsum(reference == eos_id, axis=1) - (reference == eos_id)
    live = ended_before == 0
    return float((tokens == reference)[live].mean())


def evaluate(model: EncoderDecoderTransformer, task: ReversalTask, size: int = 200,
             seed: int = 12345) -> float:
    """Exact-match accuracy of greedy decoding on ``size`` fresh examples."""
    src, tgt = task.batch(size, torch.Generator().manual_seed(seed))
    return exact_match(model.generate(src, max_new_tokens=task.max_len + 1), tgt)


def train(model: EncoderDecoderTransformer, task: ReversalTask, *, steps: int = 1500,
          batch_size: int = 64, warmup: int = 200, peak_lr: float = 1e-3, seed: int = 0,
          check_every: int = 250, target: float = 0.995,
          on_step: Callable[[int, float], None] | None = None) -> list[float]:
    """Teacher-forced cross-entropy training until solved (held-out exact match >= ``target``,
    checked every ``check_every`` steps) or ``steps``; returns the loss of every step.

    The learning rate follows the paper's shape (linear warm-up, then 1/sqrt(step) decay),
    scaled to ``peak_lr`` at the end of warm-up.
    """
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=peak_lr, betas=(0.9, 0.98), eps=1e-9)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min((s + 1) / warmup, math.sqrt(warmup / (s + 1))))
    model.train()
    losses = []
    for step in range(steps):
        src, tgt = task.batch(batch_size, generator)
        decoder_in = torch.cat([torch.full((batch_size, 1), BOS), tgt[:, :-1]], dim=1)
        logits = model(src, decoder_in)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1), ignore_index=PAD)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
        if on_step is not None:
            on_step(step, losses[-1])
        if (step + 1) % check_every == 0 and evaluate(model, task) >= target:
            break
        model.train()
    model.eval()
    return losses


def run_demo(output: Path, *, steps: int = 1500, seed: int = 0,
             console: Console | None = None) -> int:
    """Returns 0 when both runtimes solve the task (>= 99 % exact match) and agree."""
    from transformer_kit.export import export_onnx
    from transformer_kit.runtime import OnnxModel

    console = console or Console()
    torch.manual_seed(seed)
    model = build_model(DEMO_CONFIG)
    cfg = model.config
    params = sum(p.numel() for p in model.parameters())
    console.print(f"[bold]1. model[/] {DEMO_CONFIG.name}: {cfg.architecture}, d_model {cfg.d_model}, "
                  f"{cfg.num_heads} heads, {cfg.n_encoder_layers}+{cfg.n_decoder_layers} layers, "
                  f"{params:,} parameters")
    task = ReversalTask()
    with Progress(TextColumn("[bold]2. training[/] reverse digit strings"), BarColumn(),
                  TextColumn("step {task.completed:>4.0f}/{task.total:.0f}  loss {task.fields[loss]:.4f}"),
                  TimeElapsedColumn(), console=console) as progress:
        bar = progress.add_task("train", total=steps, loss=float("nan"))
        losses = train(model, task, steps=steps, seed=seed,
                       on_step=lambda step, loss: progress.update(bar, completed=step + 1, loss=loss))
        progress.update(bar, total=len(losses))
    output.mkdir(parents=True, exist_ok=True)
    model.save(output / "model")
    console.print(f"[bold]3. export[/] to {output / 'onnx'}")
    report = export_onnx(model, output / "onnx")
    console.print(f"   max error against PyTorch {report.max_error:.2e}, {report.export_seconds:.1f} s")
    om = OnnxModel(output / "onnx")

    src, tgt = task.batch(500, torch.Generator().manual_seed(seed + 1000))
    torch_out = model.generate(src, max_new_tokens=task.max_len + 1)
    onnx_out = torch.from_numpy(om.generate(src.numpy(), max_new_tokens=task.max_len + 1))
    table = Table(title="4. greedy decoding of unseen strings")
    for column in ("source", "expected", "PyTorch", f"onnxruntime ({om.provider})"):
        table.add_column(column)
    for row in range(6):
        table.add_row(to_text(src[row]), to_text(tgt[row]), to_text(torch_out[row]),
                      to_text(onnx_out[row]))
    console.print(table)
    torch_acc, onnx_acc = exact_match(torch_out, tgt), exact_match(onnx_out, tgt)
    same = torch.equal(torch_out, onnx_out)
    console.print(f"[bold]accuracy on 500 unseen strings:[/] PyTorch {torch_acc:.1%}, "
                  f"onnxruntime {onnx_acc:.1%}; identical tokens: {same}")
    int4 = export_onnx(model, output / "onnx-int4", quantize="int4")
    int4_out = OnnxModel(output / "onnx-int4").generate(src.numpy(), max_new_tokens=task.max_len + 1)
    console.print(f"[bold]5. int4 weights:[/] {greedy_agreement(int4_out, onnx_out.numpy(), EOS):.2%} of "
                  f"float32's greedy tokens, exact match {exact_match(torch.from_numpy(int4_out), tgt):.1%}")
    console.print(f"   {int4.folder_bytes / 1e3:.0f} kB of graphs and weights (float32: "
                  f"{report.folder_bytes / 1e3:.0f} kB)")
    console.print(f"artefacts: {output / 'model'} (PyTorch), {output / 'onnx'} (ONNX), "
                  f"{output / 'onnx-int4'} (ONNX, int4)")
    return 0 if same and min(torch_acc, onnx_acc) >= 0.99 else 1
