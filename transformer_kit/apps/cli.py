"""The ``transformer-kit`` command. Each command is one module of
:mod:`transformer_kit.apps.commands` with a ``register(app)`` function; they are found by name,
so adding a command is adding a module (and its test).

Errors print one line (no traceback unless ``--debug``) and exit with status 1; bad usage exits
with status 2, as click does.
"""

from __future__ import annotations

import importlib
import pkgutil
import warnings
from typing import Annotated

import typer

from transformer_kit.apps import commands
from transformer_kit.apps.terminal import end_process, error, fit_to_terminal, settings, warn
from transformer_kit.core.dependencies import TORCH_EXTRA, TORCH_INSTALL


def command_modules() -> list[str]:
    """Names of the command modules, sorted (the order ``--help`` lists them in)."""
    return sorted(info.name for info in pkgutil.iter_modules(commands.__path__)
                  if not info.name.startswith("_"))


def build_app() -> typer.Typer:
    """The typer application with every command registered."""
    app = typer.Typer(help="Transformer components as plugins: build, export to ONNX, run.",
                      no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False)

    @app.callback()
    def _options(debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False) -> None:
        settings["debug"] = debug
        fit_to_terminal()
        # the kit's warnings as one "warning: ..." line, like its errors
        warnings.showwarning = lambda message, *args, **kwargs: warn(str(message))

    for name in command_modules():
        importlib.import_module(f"{commands.__name__}.{name}").register(app)
    return app


app = build_app()


def main() -> None:
    try:
        try:
            app()
        except ModuleNotFoundError as exc:  # a command that needs the torch extra, where it is not installed
            if exc.name not in TORCH_EXTRA or settings["debug"]:
                raise
            error(f"this command needs the torch extra ({exc.name} is not installed): {TORCH_INSTALL}. "
                  "Running and serving an export does not.")
            raise SystemExit(1) from None
    except SystemExit as done:
        if settings["exit_without_teardown"]:
            end_process(done.code)
        raise
