"""The sandbox a checkpoint's chat template runs in.

A chat template is code that comes with a checkpoint, so it runs in jinja2's
``ImmutableSandboxedEnvironment`` configured as transformers configures it (``trim_blocks``,
``lstrip_blocks``, ``loopcontrols``, the ``{% generation %}`` tag, ``tojson`` as ``json.dumps``
without HTML escaping, ``raise_exception``, ``strftime_now``, a ``dict`` and a ``namespace`` that
refuse underscore names), so it renders the text transformers renders. Beyond the sandbox's rules
(no attribute of Python's internals, no mutation of what it is given, ``range`` bounded), a
render is stopped when it runs longer than :data:`RENDER_SECONDS` or makes this process grow by
more than :data:`RENDER_GROWTH_BYTES`, and ``*`` may not build a sequence longer than
:data:`LONGEST_REPEAT`: a template that loops without end or doubles a string forty times ends
in a :class:`~transformer_kit.core.errors.ChatTemplateError`, never a hang.
"""

from __future__ import annotations

import json
import sys
import time
from datetime import datetime
from functools import lru_cache
from typing import Any, ClassVar

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from transformer_kit.core.errors import ChatTemplateError

#: Longest a template may render (seconds of this thread's time, wall clock).
RENDER_SECONDS = 5.0
#: Most this process may grow (resident memory) while a template renders.
RENDER_GROWTH_BYTES = 1 << 30
#: Longest sequence (characters or items) one ``*`` in a template may build.
LONGEST_REPEAT = 1 << 20
_TEMPLATE_FILE = "<template>"  # the file name jinja2 gives the code it compiles a template to
_MEMORY_EVERY = 0.005  # seconds between two looks at the process's memory


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """``json.dumps`` without jinja2's HTML escaping (what templates expect, as transformers)."""
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class _TemplateDict:
    """``dict(...)`` and ``dict.fromkeys(...)`` in a template, without the type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        return dict.fromkeys(*args, **kwargs)


class _Namespace(jinja2.utils.Namespace):
    """jinja2's ``namespace`` refusing underscore-prefixed attribute names."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise SecurityError(f"a chat template may not store the attribute {name!r} on a namespace")


class _Generation(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` marks the assistant's text; rendered as is."""

    tags: ClassVar[set[str]] = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    @staticmethod
    def _body(caller: Any) -> str:
        return caller()


class _Environment(ImmutableSandboxedEnvironment):
    """The sandbox, with ``*`` and ``**`` checked so one operation cannot take the memory."""

    intercepted_binops = frozenset({"*", "**"})

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            for sequence, times in ((left, right), (right, left)):
                if (isinstance(sequence, (str, list, tuple)) and isinstance(times, int)
                        and len(sequence) * times > LONGEST_REPEAT):
                    raise SecurityError(f"a chat template may not repeat a sequence of "
                                        f"{len(sequence)} items {times} times (at most "
                                        f"{LONGEST_REPEAT} items)")
        if (operator == "**" and isinstance(left, int) and isinstance(right, int)
                and abs(left) > 1 and right > 4096):
            raise SecurityError(f"a chat template may not compute {left} ** {right}")
        return super().call_binop(context, operator, left, right)


@lru_cache(maxsize=1)
def environment() -> ImmutableSandboxedEnvironment:
    """The sandboxed jinja2 environment chat templates are compiled in (one per process)."""
    env = _Environment(trim_blocks=True, lstrip_blocks=True,
                       extensions=[_Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _Namespace
    return env


@lru_cache(maxsize=32)
def compile_template(source: str) -> jinja2.Template:
    """``source`` compiled in the sandbox; raises :class:`ChatTemplateError` for a syntax error."""
    try:
        return environment().from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as exc:
        raise ChatTemplateError(f"The chat template does not compile: {exc.message} (line "
                                f"{exc.lineno}). Fix the template (chat_template.jinja or "
                                "tokenizer_config.json's chat_template).") from None


def _resident_bytes() -> int | None:
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * 4096
    except (OSError, ValueError, IndexError):  # not Linux: the time limit still holds
        return None


class _Limits:
    """A trace function for the template's own frames that stops it past the time or memory
    limit (sys.settrace covers this thread only; the previous tracer is put back after)."""

    def __init__(self, seconds: float, growth: int) -> None:
        self.deadline = time.monotonic() + seconds
        self.start = _resident_bytes()
        self.growth = growth
        self.next_look = 0.0
        self.stopped: str | None = None

    def calls(self, frame: Any, event: str, arg: Any) -> Any:
        return self.lines if frame.f_code.co_filename == _TEMPLATE_FILE else None

    def lines(self, frame: Any, event: str, arg: Any) -> Any:
        now = time.monotonic()
        if now > self.deadline:
            self.stopped = f"it ran longer than {RENDER_SECONDS:g} s"
        elif self.start is not None and now >= self.next_look:
            self.next_look = now + _MEMORY_EVERY
            grown = (_resident_bytes() or 0) - self.start
            if grown > self.growth:
                self.stopped = f"it made the process grow by {grown >> 20} MiB"
        if self.stopped:
            raise _Stopped(self.stopped)
        return self.lines


class _Stopped(Exception):
    """Raised inside a template's frame when it passes a limit."""


def render(template: jinja2.Template, variables: dict[str, Any], *,
           seconds: float = RENDER_SECONDS, growth: int = RENDER_GROWTH_BYTES) -> str:
    """``template`` rendered with ``variables`` within the limits.

    Raises :class:`ChatTemplateError` when the template raises (``raise_exception``: its own
    sentence), breaks a sandbox rule, or passes a limit.
    """
    limits = _Limits(seconds, growth)
    previous = sys.gettrace()
    sys.settrace(limits.calls)
    try:
        return template.render(**variables)
    except _Stopped as exc:
        raise ChatTemplateError(f"The chat template was stopped: {exc}. A chat template renders a "
                                "conversation in milliseconds; this one loops or grows without "
                                "end. Use another template (chat_template=...).") from None
    except SecurityError as exc:
        raise ChatTemplateError(f"The chat template broke the sandbox's rules ({exc}) and was "
                                "stopped. It is code from the checkpoint; use a template you "
                                "trust (chat_template=...).") from None
    except jinja2.exceptions.TemplateError as exc:
        raise ChatTemplateError(f"The chat template refused this conversation: {exc}") from None
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, ZeroDivisionError,
            OverflowError, RecursionError) as exc:
        raise ChatTemplateError(f"The chat template failed on this conversation ({type(exc).__name__}: "
                                f"{exc}); check the messages' fields (role, content, tool_calls) "
                                "against what the template reads.") from None
    finally:
        sys.settrace(previous)
