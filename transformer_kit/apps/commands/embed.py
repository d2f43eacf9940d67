"""``transformer-kit embed``: sentence embeddings of texts from an export folder (onnxruntime)
or a sentence-transformers / Hugging Face folder or Hub name (PyTorch), printed or written as
.npy."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Annotated

import numpy as np
import typer

from transformer_kit.apps.sources import REVISION_HELP, Provider, kind_of, open_export, resolve_source
from transformer_kit.apps.terminal import console, fail
from transformer_kit.core.errors import InputError, TransformerKitError

_Opt = typer.Option


def read_texts(text: list[str] | None, file: Path | None) -> list[str]:
    """--text values, then --file's lines (empty lines skipped)."""
    texts = list(text or [])
    if file is not None:
        try:
            texts += [line for line in file.read_text(encoding="utf-8").splitlines() if line.strip()]
        except (OSError, UnicodeDecodeError) as exc:
            raise typer.BadParameter(f"cannot read {str(file)!r} as UTF-8 text: {exc}.",
                                     param_hint="--file") from None
    if not texts:
        raise typer.BadParameter("give texts: --text (repeatable) and/or --file (one per line).",
                                 param_hint="--text / --file")
    return texts


def open_model(folder: Path, provider: Provider, revision: str | None = None):
    """An OnnxModel of an export folder, else the PyTorch model of a checkpoint folder or of a
    checkpoint's Hub name (at ``revision``)."""
    folder, _ = resolve_source(folder, revision)
    if kind_of(folder) == "checkpoint":
        import transformer_kit as tk

        return tk.from_hf(folder)
    return open_export(folder, provider)


def _write_npy(path: Path, vectors: np.ndarray) -> None:
    """Write ``vectors`` to ``path`` whole or not at all (a temporary file moved into place)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(suffix=".npy", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as out:
            np.save(out, vectors)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def embed(
    folder: Annotated[Path, typer.Argument(help="An export folder, or a sentence-transformers "
                                           "(or Hugging Face) folder or Hub name (org/name) run in PyTorch.")],
    text: Annotated[list[str] | None, _Opt(help="A text to embed (repeat for more).")] = None,
    file: Annotated[Path | None, _Opt(help="A UTF-8 file of texts, one per line.")] = None,
    output: Annotated[Path | None, _Opt("--output", "-o", help="Write the (n, dim) float32 "
                                        "vectors to this .npy file instead of printing them.")] = None,
    prompt_name: Annotated[str | None, _Opt(help="One of the model's prompts (e.g. query).")] = None,
    normalize: Annotated[bool, _Opt(help="L2-normalise the vectors.")] = False,
    dimensions: Annotated[int | None, _Opt(help="Keep the first N features.")] = None,
    batch_size: Annotated[int, _Opt(help="Texts per run at most.")] = 32,
    provider: Annotated[Provider, _Opt(help="Where onnxruntime runs (export folders).")] = Provider.auto,
    revision: Annotated[str | None, _Opt(help=REVISION_HELP)] = None,
) -> None:
    """Sentence embeddings of texts: printed one row per text, or written to --output (.npy)."""
    texts = read_texts(text, file)
    try:
        model = open_model(folder, provider, revision)
        start = time.perf_counter()
        vectors = model.embed(texts, prompt_name=prompt_name, normalize=normalize or None,
                              dimensions=dimensions, batch_size=batch_size)
        elapsed = time.perf_counter() - start
        if output is not None:
            if output.suffix != ".npy":
                raise InputError(f"--output {str(output)!r} must end in .npy (numpy's format).")
            _write_npy(output, vectors)
    except TransformerKitError as exc:
        fail(exc)
    if output is None:
        with np.printoptions(precision=6, suppress=True, linewidth=200, threshold=10**9):
            for row in vectors:
                console.print(" ".join(f"{v:.6g}" for v in row), highlight=False)
    else:
        console.print(f"wrote {vectors.shape[0]} x {vectors.shape[1]} float32 to {output}", highlight=False)
    console.print(f"{len(texts)} texts in {elapsed * 1e3:.0f} ms", highlight=False, style="dim")


def register(app: typer.Typer) -> None:
    app.command()(embed)
