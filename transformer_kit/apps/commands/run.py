"""``transformer-kit run``: the exported forward graph on token ids; prints the output's shape and
the most likely token at every position."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from transformer_kit.apps.sources import Provider, open_export, pad_rows, parse_ids
from transformer_kit.apps.terminal import console, fail
from transformer_kit.core.errors import TransformerKitError


def run(
    folder: Annotated[Path, typer.Argument(help="An export folder.")],
    ids: Annotated[str, typer.Option(help='Token ids, rows separated by ";": "5 6 7; 8 9".')],
    tgt_ids: Annotated[str | None, typer.Option(help="Target ids (encoder_decoder).")] = None,
    provider: Annotated[Provider, typer.Option(help="Where onnxruntime runs.")] = Provider.auto,
) -> None:
    """Run the exported forward graph; print the output shape and the top token per position."""
    rows = parse_ids(ids)
    tgt_rows = parse_ids(tgt_ids, "--tgt-ids") if tgt_ids else None
    try:
        om = open_export(folder, provider)
        pad = om.manifest.pad_id
        inputs = [pad_rows(rows, pad)]
        if om.manifest.architecture == "encoder_decoder":
            if tgt_rows is None and om.manifest.bos_id is None:
                raise typer.BadParameter("this model has no bos_id to start targets from; give them.",
                                         param_hint="--tgt-ids")
            inputs.append(pad_rows(tgt_rows or [[om.manifest.bos_id]] * len(rows), pad))
        out = om(*inputs)
    except TransformerKitError as exc:
        fail(exc)
    output = om.manifest.graphs["model"].outputs[0]
    console.print(f"provider: {om.provider}")
    console.print(f"output {output}: shape {list(out.shape)}, dtype {out.dtype}")
    if output == "logits":
        console.print(f"argmax: {out.argmax(-1).tolist()}")


def register(app: typer.Typer) -> None:
    app.command()(run)
