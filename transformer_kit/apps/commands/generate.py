"""``transformer-kit generate``: greedy generation in onnxruntime from an export folder."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from transformer_kit.apps.sources import Provider, open_export, pad_rows, parse_ids
from transformer_kit.apps.terminal import console, fail
from transformer_kit.errors import TransformerKitError


def generate(
    folder: Annotated[Path, typer.Argument(help="An export folder.")],
    ids: Annotated[str, typer.Option(help='Prompt (or source) ids, rows separated by ";".')],
    max_new_tokens: Annotated[int, typer.Option(min=0, help="Tokens to generate at most.")] = 16,
    provider: Annotated[Provider, typer.Option(help="Where onnxruntime runs.")] = Provider.auto,
) -> None:
    """Greedy generation in onnxruntime from the exported decoder step."""
    rows = parse_ids(ids)
    try:
        om = open_export(folder, provider)
        prompts = pad_rows(rows, om.manifest.pad_id)
        start = time.perf_counter()
        tokens = om.generate(prompts, max_new_tokens=max_new_tokens)
        elapsed = time.perf_counter() - start
    except TransformerKitError as exc:
        fail(exc)
    console.print(f"provider: {om.provider}")
    for row in tokens.tolist():
        console.print(" ".join(map(str, row)))
    console.print(f"{tokens.size} tokens in {elapsed * 1e3:.0f} ms "
                  f"({tokens.size / max(elapsed, 1e-9):.0f} tokens/s)")


def register(app: typer.Typer) -> None:
    app.command()(generate)
