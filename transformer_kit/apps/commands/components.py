"""``transformer-kit components``: every registered component and checkpoint family with its
plugin, distribution and capabilities; plugins that failed to load, with their error."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from transformer_kit.apps.terminal import console, fail
from transformer_kit.core.errors import TransformerKitError


def components(kind: Annotated[str | None, typer.Option(help="Only this kind.")] = None) -> None:
    """List the registered components and checkpoint families, with their plugins.

    Each component with its plugin, distribution and capabilities (ONNX: yes, no, or fused when
    it declares a fused lowering); the checkpoint families from_hf can load; plugins that failed
    to load, with their error.
    """
    from transformer_kit.core.registry import get_registry

    try:
        registry = get_registry()
        entries = registry.entries(kind)
    except TransformerKitError as exc:
        fail(exc)
    table = Table(title="transformer_kit components")
    for column in ("kind", "name", "plugin", "distribution", "ONNX", "cache", "description"):
        table.add_column(column)
    for e in entries:
        c = e.component
        onnx = "fused" if c.lowerings else ("yes" if c.exportable else "no")
        table.add_row(c.kind, c.name, e.plugin, e.distribution or "built-in", onnx,
                      "yes" if c.supports_cache else "no", c.description)
    console.print(table)
    if kind is None:
        families = Table(title="checkpoint families (from_hf, export --from-hf)")
        for column in ("model_type", "plugin", "distribution", "description"):
            families.add_column(column)
        for f in registry.families():
            families.add_row(f.family.model_type, f.plugin, f.distribution or "built-in",
                             f.family.description)
        console.print(families)
    for failure in registry.failures:
        console.print(f"[red]not loaded:[/] plugin {failure.plugin!r} "
                      f"({failure.distribution or 'no distribution'}): {failure.error}")


def register(app: typer.Typer) -> None:
    app.command()(components)
