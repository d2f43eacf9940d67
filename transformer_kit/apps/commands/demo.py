"""``transformer-kit demo``: the main job on the built-in reversal task (train, save, export,
generate in PyTorch and onnxruntime, compare)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from transformer_kit.apps.terminal import console, fail
from transformer_kit.core.errors import TransformerKitError


def demo(
    output: Annotated[Path, typer.Option("-o", "--output", help="Where the artefacts go.")] = Path("transformer-kit-demo"),
    steps: Annotated[int, typer.Option(min=1, help="Training steps at most (stops once solved).")] = 1500,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
) -> None:
    """Train the paper's encoder-decoder to reverse digit strings, export it, compare runtimes."""
    from transformer_kit.apps.demo import run_demo

    try:
        code = run_demo(output, steps=steps, seed=seed, console=console)
    except TransformerKitError as exc:
        fail(exc)
    raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    app.command()(demo)
