"""``transformer-kit config show|validate|schema``: a config resolved from any source, checked as
``build_model`` checks it (without allocating weights), and the JSON schema of config files."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from transformer_kit.apps.sources import ACCEPTED, REVISION_HELP, resolve_config
from transformer_kit.apps.terminal import console, fail, warn
from transformer_kit.core.errors import TransformerKitError

config_app = typer.Typer(help="Show, validate or describe model configs.", no_args_is_help=True)


@config_app.command("show")
def config_show(source: Annotated[Path, typer.Argument(help=f"{ACCEPTED[0].upper()}{ACCEPTED[1:]}.")],
                revision: Annotated[str | None, typer.Option(help=REVISION_HELP)] = None) -> None:
    """Print the resolved config (defaults filled in) as YAML."""
    import yaml

    try:
        config = resolve_config(source, revision)
    except TransformerKitError as exc:
        fail(exc)
    console.print(yaml.safe_dump(config.to_dict(), sort_keys=False), end="", highlight=False)


@config_app.command("validate")
def config_validate(source: Annotated[Path, typer.Argument(help="Config file (or any model folder, or a Hub name) to check.")],
                    revision: Annotated[str | None, typer.Option(help=REVISION_HELP)] = None) -> None:
    """Check a config as build_model does, without allocating weights; print its size.

    Keys, values, component names, their combination and every component's parameters.
    """
    from transformer_kit.core.assembly import check_config

    try:
        config = resolve_config(source, revision)
        size = check_config(config)
    except TransformerKitError as exc:
        fail(exc)
    from transformer_kit.core.memory import available_memory

    detail = f", {size}" if size is not None else ""
    console.print(f"[green]valid:[/] {source} ({config.architecture}, d_model {config.d_model}{detail})",
                  highlight=False)
    memory = available_memory()
    if size is not None and memory is not None and size.bytes > memory:
        warn(f"its weights need more than the {memory / 1e9:.1f} GB of memory available here, so "
             "building it on this machine (export, bench ...) would be refused.")


@config_app.command("schema")
def config_schema(output: Annotated[Path | None, typer.Option("-o", "--output", help="Write here instead of stdout.")] = None) -> None:
    """The JSON schema of a config file, for editors (components: a name or {name, params})."""
    from transformer_kit.core.config import ModelConfig

    text = json.dumps(ModelConfig.model_json_schema(), indent=2)
    if output is None:
        sys.stdout.write(text + "\n")
        return
    try:
        output.write_text(text + "\n")
    except OSError as exc:
        fail(f"Cannot write {str(output)!r}: {exc.strerror or exc}.")
    console.print(f"wrote {output}")


def register(app: typer.Typer) -> None:
    app.add_typer(config_app, name="config")
