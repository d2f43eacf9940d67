"""``transformer-kit plot positional|attention``: PNG heat maps of a positional encoding and of a
model's attention weights (one PNG per layer, a panel per head)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from transformer_kit.apps.sources import REVISION_HELP, load_model, parse_ids
from transformer_kit.apps.terminal import console, fail
from transformer_kit.core.errors import TransformerKitError

plot_app = typer.Typer(help="Heat maps of positional encodings and attention weights.", no_args_is_help=True)


@plot_app.command("positional")
def plot_positional_cmd(
    output: Annotated[Path, typer.Option("-o", "--output", help="PNG file.")] = Path("positional.png"),
    name: Annotated[str, typer.Option(help="Positional component.")] = "sinusoidal",
    length: Annotated[int, typer.Option(min=1, max=100_000, help="Positions (rows).")] = 50,
    d_model: Annotated[int, typer.Option(min=2, max=65_536, help="Dimensions (columns).")] = 128,
) -> None:
    """Heat map of a positional encoding (the paper's sinusoidal table is 50 x 128 here)."""
    from transformer_kit.apps.plotting import plot_positional

    try:
        path = plot_positional(output, name, length, d_model)
    except TransformerKitError as exc:
        fail(exc)
    console.print(f"wrote {path}")


@plot_app.command("attention")
def plot_attention_cmd(
    source: Annotated[Path, typer.Argument(help="Config file, saved model folder, GGUF file, or a Hub name (org/name, org/name:FILE.gguf).")],
    ids: Annotated[str, typer.Option(help="Input (or source) ids of one row.")],
    tgt_ids: Annotated[str | None, typer.Option(help="Target ids (encoder_decoder).")] = None,
    output: Annotated[Path, typer.Option("-o", "--output", help="Folder for the PNGs.")] = Path("attention"),
    revision: Annotated[str | None, typer.Option(help=REVISION_HELP)] = None,
) -> None:
    """Attention weights of every layer and head for one input, one PNG per layer."""
    import torch

    from transformer_kit.apps.plotting import plot_attention

    try:
        model = load_model(source, revision=revision)
        inputs: list[Any] = [torch.tensor(parse_ids(ids)[:1])]
        if model.architecture == "encoder_decoder":
            start = tgt_ids or (str(model.config.bos_id) if model.config.bos_id is not None else None)
            if start is None:
                raise typer.BadParameter("this model has no bos_id; give target ids.", param_hint="--tgt-ids")
            inputs.append(torch.tensor(parse_ids(start, "--tgt-ids")[:1]))
        paths = plot_attention(model, tuple(inputs), output)
    except TransformerKitError as exc:
        fail(exc)
    for path in paths:
        console.print(f"wrote {path}")


def register(app: typer.Typer) -> None:
    app.add_typer(plot_app, name="plot")
