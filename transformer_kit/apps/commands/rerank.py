"""``transformer-kit rerank``: a cross-encoder's ranking of documents for a query, from its
export folder (onnxruntime) or its checkpoint folder (PyTorch)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from transformer_kit.apps.commands.embed import open_model, read_texts
from transformer_kit.apps.sources import REVISION_HELP, Provider
from transformer_kit.apps.terminal import console, fail
from transformer_kit.core.errors import TransformerKitError

_Opt = typer.Option


def rerank(
    folder: Annotated[Path, typer.Argument(help="A cross-encoder's export folder, or its "
                                           "checkpoint folder or Hub name (org/name) run in PyTorch.")],
    query: Annotated[str, _Opt(help="The query.")],
    document: Annotated[list[str] | None, _Opt(help="A document (repeat for more).")] = None,
    file: Annotated[Path | None, _Opt(help="A UTF-8 file of documents, one per line.")] = None,
    top_n: Annotated[int | None, _Opt(help="Print the best N only.")] = None,
    provider: Annotated[Provider, _Opt(help="Where onnxruntime runs (export folders).")] = Provider.auto,
    revision: Annotated[str | None, _Opt(help=REVISION_HELP)] = None,
) -> None:
    """Rank documents by a cross-encoder's relevance to --query: score, index, document."""
    documents = read_texts(document, file)
    try:
        ranked = open_model(folder, provider, revision).rerank(query, documents, top_n=top_n)
    except TransformerKitError as exc:
        fail(exc)
    for result in ranked:
        console.print(f"{result.score:.6f}\t{result.index}\t{documents[result.index]}",
                      highlight=False, markup=False)


def register(app: typer.Typer) -> None:
    app.command()(rerank)
