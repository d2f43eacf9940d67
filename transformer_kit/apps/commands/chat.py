"""``transformer-kit chat``: a conversation with an export's chat model in onnxruntime. The turns
come from ``--message`` (then it exits), else from the terminal (a session: ``/reset``, ``/exit``)
or from stdin's lines (a pipe); each reply streams as it is generated and joins the history."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Annotated, Any, TextIO

import typer
from rich.markup import escape

from transformer_kit.apps.commands import _options as opts
from transformer_kit.apps.exporting import served_folder
from transformer_kit.apps.sources import Provider, open_export
from transformer_kit.apps.terminal import console, errors, fail, settings
from transformer_kit.core.errors import TransformerKitError
from transformer_kit.runtime.chat_session import DEFAULT_REPLY_TOKENS, ChatSession, check_reply_options

_Opt = typer.Option

EXIT, RESET = ("/exit", "/quit"), "/reset"
HELP = "/reset clears the conversation (the system message stays); /exit, /quit or Ctrl-D ends it."


#: What stands before a reasoning model's thinking and before its answer after thinking.
THINKING, ANSWER = "[thinking] ", "[answer] "


def reply(session: ChatSession, text: str, out: TextIO) -> str:
    """The session's reply to the user's ``text``, written to ``out`` as it is generated (then a
    newline): a reasoning model's thinking after ``[thinking]``, its answer after ``[answer]``,
    without the template's markup. Returns the answer."""
    content, thought = [], False
    for reasoning, answer in session.reply_parts(text):
        if reasoning:
            out.write(("" if thought else THINKING) + reasoning)
            thought = True
        if answer:
            out.write((f"\n{ANSWER}" if thought and not content else "") + answer)
            content.append(answer)
        out.flush()
    out.write("\n")
    return "".join(content)


def chat(
    source: Annotated[Path, typer.Argument(help="A model with a tokenizer and a chat template. " + opts.SERVED_SOURCE)],
    message: Annotated[list[str] | None, _Opt(help="A user turn (repeatable): answer each in order, then exit.")] = None,
    system: Annotated[str | None, _Opt(help="The system message, first in the conversation.")] = None,
    max_new_tokens: Annotated[int | None, _Opt(help=f"Tokens per reply at most (default {DEFAULT_REPLY_TOKENS}, or what the context has left).")] = None,
    min_new_tokens: opts.MinNewTokens = None,
    do_sample: opts.DoSample = False,
    temperature: opts.Temperature = None,
    top_k: opts.TopK = None,
    top_p: opts.TopP = None,
    min_p: opts.MinP = None,
    repetition_penalty: opts.RepetitionPenalty = None,
    no_repeat_ngram_size: opts.NoRepeatNgramSize = None,
    eos_id: opts.EosId = None,
    stop: opts.Stop = None,
    seed: opts.Seed = None,
    json_object: Annotated[bool, _Opt("--json", help="Replies are JSON objects.")] = False,
    json_schema: Annotated[Path | None, _Opt(exists=True, dir_okay=False, help="Replies are JSON valid against this schema file.")] = None,
    regex: Annotated[str | None, _Opt(help="Replies match this regular expression whole.")] = None,
    choice: Annotated[list[str] | None, _Opt(help="Replies are one of these strings (repeatable).")] = None,
    chat_template: Annotated[str | None, _Opt(help="A template of the export by name (e.g. tool_use), or a file holding one, instead of its default.")] = None,
    generation_config: opts.GenerationConfigMode = opts.GenerationMode.auto,
    provider: opts.ProviderOption = Provider.auto,
    revision: opts.RevisionOption = None,
    quantize: opts.ServedQuantize = None,
) -> None:
    """Chat with an export's model: --message turns, else a session (one line per turn)."""
    options = opts.given_options(
        min_new_tokens=min_new_tokens, do_sample=do_sample, temperature=temperature, top_k=top_k,
        top_p=top_p, min_p=min_p, repetition_penalty=repetition_penalty,
        no_repeat_ngram_size=no_repeat_ngram_size, eos_id=eos_id, stop=stop, seed=seed,
        response_format=response_format(json_object, json_schema, regex, choice),
        use_generation_defaults=None if generation_config == opts.GenerationMode.auto else False)
    try:  # bad options, a missing tokenizer or template: refused before the first turn
        check_reply_options(max_new_tokens, **options)  # a bad option is told before a bad folder
        folder = served_folder(source, revision, quantize)
        om = open_export(folder, provider)
        opts.report_sampling(om, options)
        session = ChatSession(om, system, max_new_tokens=max_new_tokens,
                              chat_template=_template(chat_template), **options)
    except TransformerKitError as exc:
        fail(exc)
    if message:
        for text in message:
            try:
                reply(session, text, sys.stdout)
            except TransformerKitError as exc:
                fail(exc)
        return
    terminal = sys.stdin.isatty()
    if terminal:
        console.print(f"Chatting with {folder} on {om.provider}. {HELP}", highlight=False, markup=False)
    converse(session, sys.stdout, terminal)


def _template(given: str | None) -> str | None:
    """--chat-template: a file's text when it names a file, else the name as given."""
    if given is not None and Path(given).is_file():
        return Path(given).read_text(encoding="utf-8")
    return given


def response_format(json_object: bool, schema_file: Path | None, regex: str | None,
                    choices: list[str] | None) -> dict[str, Any] | None:
    """The structured output --json, --json-schema, --regex or --choice asks for (one of them)."""
    flags = {"--json": json_object, "--json-schema": schema_file, "--regex": regex, "--choice": choices}
    given = [flag for flag, value in flags.items() if value]
    if len(given) > 1:
        raise typer.BadParameter(f"{' and '.join(given)} were given, and each constrains the whole "
                                 "reply; give one of them.", param_hint=" / ".join(flags))
    if json_object:
        return {"type": "json_object"}
    if schema_file is not None:
        return {"type": "json_schema", "json_schema": _read_schema(schema_file)}
    if regex is not None:
        return {"type": "regex", "regex": regex}
    return {"type": "choice", "choices": list(choices)} if choices else None


def _read_schema(path: Path) -> dict[str, Any]:
    """A JSON schema file's object: the schema itself, or OpenAI's {"name", "schema"}."""
    try:
        schema = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise typer.BadParameter(f"{str(path)!r} cannot be read as JSON ({exc}); give a file holding a "
                                 "JSON schema.", param_hint="--json-schema") from None
    if not isinstance(schema, dict):
        raise typer.BadParameter(f"{str(path)!r} holds a JSON {type(schema).__name__}, not a schema; "
                                 'give a JSON object, e.g. {"type": "object", "properties": {...}}.',
                                 param_hint="--json-schema")
    return schema


def converse(session: ChatSession, out: TextIO, terminal: bool) -> None:
    """Read user turns from stdin until /exit, /quit or its end; /reset clears the history. An
    error in a turn prints its sentence and the session goes on. On a terminal: a "you> "
    prompt with line editing; Ctrl-C stops a reply (the turn is dropped) or, at the prompt,
    ends the session."""
    if terminal:
        with contextlib.suppress(ImportError):
            import readline  # noqa: F401  (line editing and history for input())
    while (text := _next_turn(out, terminal)) is not None and text not in EXIT:
        if text == RESET:
            session.reset()
            if terminal:
                console.print("(conversation cleared)", style="dim", highlight=False)
        elif text:
            _answer(session, text, out)


def _next_turn(out: TextIO, terminal: bool) -> str | None:
    """The user's next line (stripped), or None at the input's end (or Ctrl-C at the prompt)."""
    try:
        return input("you> " if terminal else "").strip()
    except (EOFError, KeyboardInterrupt):
        if terminal:
            out.write("\n")
        return None


def _answer(session: ChatSession, text: str, out: TextIO) -> None:
    """The model's reply to ``text``; an error prints its sentence, Ctrl-C drops the turn."""
    try:
        reply(session, text, out)
    except TransformerKitError as exc:
        _report(exc)
    except KeyboardInterrupt:
        out.write("\n")
        console.print("(reply stopped; the turn is dropped)", style="dim", highlight=False)


def _report(exc: TransformerKitError) -> None:
    """``error: <message>`` on stderr, and the session goes on (re-raised under ``--debug``)."""
    if settings["debug"]:
        raise exc
    errors.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, markup=True, soft_wrap=True)


def register(app: typer.Typer) -> None:
    app.command()(chat)
