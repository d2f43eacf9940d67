"""``transformer-kit demo``: the main job end to end on the built-in reversal task.

Assemble the paper's encoder-decoder from the shipped ``configs/demo.yaml``, train it until it
reverses digit strings, save it, export it to ONNX, generate with onnxruntime, and print
source/output pairs and the accuracy of PyTorch and onnxruntime side by side.
"""

from __future__ import annotations

from pathlib import Path

import torch
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from transformer_kit.assembly import build_model
from transformer_kit.demo import DEMO_CONFIG, ReversalTask, exact_match, to_text, train


def run_demo(output: Path, *, steps: int = 1500, seed: int = 0,
             console: Console | None = None) -> int:
    """Returns 0 when both runtimes solve the task (>= 99 % exact match) and agree."""
    from transformer_kit.export import OnnxModel, export_onnx

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
    console.print(f"artefacts: {output / 'model'} (PyTorch), {output / 'onnx'} (ONNX)")
    return 0 if same and min(torch_acc, onnx_acc) >= 0.99 else 1
