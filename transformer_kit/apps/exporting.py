"""Exports the commands make: ``transformer-kit export``'s, drawn as a progress bar, and the
export a serving command makes for itself when it is given a checkpoint instead of an export
(``transformer-kit serve Qwen/Qwen3-0.6B``, ``transformer-kit chat my-checkpoint``).

A command's own export is made once into the kit's cache (``TRANSFORMER_KIT_CACHE``, else
``$XDG_CACHE_HOME/transformer_kit``, else ``~/.cache/transformer_kit``) under a key of what it is
made from: the checkpoint's files (their paths, sizes and modification times; a Hub name's files
are its snapshot's), the export's options and the kit's version. So it is made again when any of
them changes and reused otherwise; it is written to a temporary folder and moved into place when
complete (as every export), so an interrupted one leaves nothing to be taken for an export.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from transformer_kit.apps.sources import kind_of, load_model, resolve_source
from transformer_kit.apps.terminal import console
from transformer_kit.core.errors import ArtifactError
from transformer_kit.runtime.manifest import MANIFEST_FILE

CACHE_ENV = "TRANSFORMER_KIT_CACHE"
#: What a serving command exports for itself; a config file would give random weights.
EXPORTABLE = ("checkpoint", "gguf", "saved model")


def export_with_progress(model: Any, output: Path, **options: Any):
    """``export_onnx(model, output, **options)`` with a progress bar on the console; its report."""
    from transformer_kit.export import export_onnx

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=True) as bar:
        task = bar.add_task(f"exporting {model.architecture} to {output}", total=None)

        def progress(step: str, done: int, total: int) -> None:
            bar.update(task, description=step, completed=done, total=total)

        return export_onnx(model, output, progress=progress, **options)


def cache_root() -> Path:
    """Where the kit keeps what it makes for itself: ``TRANSFORMER_KIT_CACHE``, else
    ``$XDG_CACHE_HOME/transformer_kit``, else ``~/.cache/transformer_kit``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "transformer_kit"


def _files(path: Path) -> list[tuple[str, int, int]]:
    """(relative path, size, mtime in ns) of ``path`` (a file) or of every file under it."""
    paths = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    stats = [(p, p.stat()) for p in paths]
    return [(str(p.relative_to(path)) if p != path else p.name, s.st_size, s.st_mtime_ns)
            for p, s in stats]


def export_key(source: Path, options: dict[str, Any]) -> str:
    """The cache key of an export of ``source`` (a local checkpoint folder or file) made with
    ``options``: 16 hex digits of the sha256 of its files, the options and the kit's version."""
    from transformer_kit import __version__

    described = {"source": str(source.resolve()), "files": _files(source), "options": options,
                 "kit": __version__}
    return hashlib.sha256(json.dumps(described, sort_keys=True, default=str).encode()).hexdigest()[:16]


def export_folder(source: Path, *, revision: str | None = None, quantize: str | None = None,
                  on_export: Callable[[Path], None] | None = None,
                  adapters: dict[str, Path] | None = None) -> Path:
    """The export folder a serving command runs for SOURCE: SOURCE itself when it is an export;
    for a checkpoint folder, a GGUF file, a folder saved with ``model.save`` or a Hub name of
    either (at ``revision``), its export with ``quantize`` (None: float32; ``"int8"``, ``"int4"``:
    the kit's defaults), made once into :func:`cache_root` and reused while nothing it is made
    from changes. ``on_export(folder)`` is called before an export is made (to say so).
    ``adapters``: PEFT LoRA adapter folders by name, exported beside a checkpoint's weights
    (their files are part of the key)."""
    local, from_hf = resolve_source(source, revision)
    kind = kind_of(local)
    if kind == "export":
        if adapters:
            raise ArtifactError(f"{str(source)!r} is an export folder, already made; --adapter "
                                "applies to a checkpoint exported here (an export's own adapters "
                                "are served without it).")
        if quantize is not None:
            raise ArtifactError(f"{str(source)!r} is an export folder, already made; --quantize "
                                "applies to a checkpoint exported here. Leave it out, or export "
                                "again: transformer-kit export SRC --quantize ... -o DIR.")
        return local
    if kind not in EXPORTABLE:
        described = {"missing": "does not exist", "config file": "is a config file (random weights)"
                     }.get(kind, "is neither an export nor a checkpoint")
        raise ArtifactError(f"{str(source)!r} {described}; "
                            "give an export folder (transformer-kit export), a Hugging Face "
                            "checkpoint folder, a GGUF file, a folder saved with model.save, or a "
                            "Hub name (org/name, org/name:FILE.gguf).")
    options = {"quantize": quantize, "adapters": {name: [str(Path(folder).resolve()), _files(Path(folder))]
                                                  for name, folder in (adapters or {}).items()}}
    name = re.sub(r"[^A-Za-z0-9._-]+", "--", str(source).strip("/")) or "model"
    folder = cache_root() / "exports" / f"{name}-{export_key(local, options)}"
    if (folder / MANIFEST_FILE).is_file():
        return folder
    if on_export is not None:
        on_export(folder)
    model = load_model(local, from_hf=from_hf or kind == "checkpoint", stream=True,
                       overrides={"adapters": adapters} if adapters else None)
    folder.parent.mkdir(parents=True, exist_ok=True)
    export_with_progress(model, folder, quantize=quantize)
    return folder


def served_folder(source: Path, revision: str | None, quantize: Any,
                  adapters: dict[str, Path] | None = None) -> Path:
    """:func:`export_folder` for a serving command (``quantize``: None or an option's enum),
    saying on the console when it exports."""
    return export_folder(source, revision=revision, quantize=getattr(quantize, "value", quantize),
                         adapters=adapters,
                         on_export=lambda folder: console.print(
                             f"exporting {source} into {folder} (once: reused while it is unchanged)",
                             highlight=False, markup=False))
