"""Terminal output shared by the commands: the consoles and the one-line error exit."""

from __future__ import annotations

import atexit
import os
import sys
from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape

console = Console()
errors = Console(stderr=True)
#: Set by ``--debug``: re-raise errors with their traceback instead of one line.
#: debug: re-raise errors with their traceback. exit_without_teardown: set by a command whose
#: process has nothing left to clean up when it returns (an export's files are closed and in
#: place), so the process ends after its exit handlers without Python's teardown of torch's and
#: onnxruntime's modules, which is slow after an export.
settings = {"debug": False, "exit_without_teardown": False}


def end_process(code: object) -> NoReturn:
    """Exit with ``code`` (as ``SystemExit`` takes it) now: flush, run the exit handlers, and
    skip the interpreter's teardown."""
    if isinstance(code, str):
        errors.print(code, highlight=False, markup=False)
    status = code if isinstance(code, int) else (0 if code is None else 1)
    atexit._run_exitfuncs()  # what normal shutdown would run (logging's flush among them)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(status)


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
    error(str(exc))
    raise typer.Exit(1)


def error(message: str) -> None:
    """Print ``error: <message>`` on one line to stderr (the message as written: brackets stay)."""
    errors.print(f"[bold red]error:[/] {escape(message)}", highlight=False, markup=True, soft_wrap=True)


def warn(message: str) -> None:
    """Print ``warning: <message>`` to stderr, in bold, so it is not missed."""
    errors.print(f"[bold yellow]warning:[/] {escape(message)}", highlight=False, markup=True, soft_wrap=True)
