"""Terminal output shared by the commands: the consoles and the one-line error exit."""

from __future__ import annotations

from typing import NoReturn

import typer
from rich.console import Console

console = Console()
errors = Console(stderr=True)
#: Set by ``--debug``: re-raise errors with their traceback instead of one line.
settings = {"debug": False}


#: The width of output to a pipe or a file: wide enough that no row of a table wraps.
PLAIN_WIDTH = 10_000


def fit_to_terminal() -> None:
    """Size both consoles for this invocation: a Console reads COLUMNS once, when it is made,
    and the command may run many times in one process (tests, notebooks), in other terminals.
    Output to a pipe or a file is plain and unwrapped (``components | grep NAME`` finds whole
    rows); a terminal gets colours and its own width."""
    for target, stderr in ((console, False), (errors, True)):
        Console.__init__(target, stderr=stderr)
        if not target.is_terminal:
            Console.__init__(target, stderr=stderr, width=PLAIN_WIDTH, soft_wrap=True)


def fail(exc: BaseException | str) -> NoReturn:
    """Print ``error: <message>`` on one line to stderr and exit with status 1 (re-raise under
    ``--debug``)."""
    if settings["debug"] and isinstance(exc, BaseException):
        raise exc
    errors.print(f"[bold red]error:[/] {exc}", highlight=False, markup=True, soft_wrap=True)
    raise typer.Exit(1)


def warn(message: str) -> None:
    """Print ``warning: <message>`` to stderr, in bold, so it is not missed."""
    errors.print(f"[bold yellow]warning:[/] {message}", highlight=False, markup=True, soft_wrap=True)
