"""``transformer-kit chat``: a conversation with an export's chat model in onnxruntime. The turns
come from ``--message`` (then it exits), else from the terminal (a session: ``/reset``, ``/exit``)
or from stdin's lines (a pipe); each reply streams as it is generated and joins the history."""

from __future__ import annotations

import contextlib
import json
import sys
import warnings
from pathlib import Path
from typing import Annotated, Any, TextIO

import typer
from rich.markup import escape

from transformer_kit.apps.commands import _options as opts
from transformer_kit.apps.sources import Provider, open_export
from transformer_kit.apps.terminal import console, errors, fail, settings
from transformer_kit.chat.conversation import DEFAULT_REPLY_TOKENS, reply_budget
from transformer_kit.decoding import generation_config
from transformer_kit.decoding.text import require
from transformer_kit.errors import InputError, TransformerKitError

_Opt = typer.Option

EXIT, RESET = ("/exit", "/quit"), "/reset"
HELP = "/reset clears the conversation (the system message stays); /exit, /quit or Ctrl-D ends it."


class Conversation:
    """The messages so far (the system message first) and the generation options of a reply.

    Args:
        om: the export's ``OnnxModel`` (it has a tokenizer with a chat template).
        system: the system message, or None.
        max_new_tokens: tokens per reply at most; None: ``DEFAULT_REPLY_TOKENS``, or what the
            model's context has left after the conversation (``reply_budget``).
        options: the other generation options (``response_format`` among them).
        chat_template: a template's name (``tool_use``) or text instead of the export's default.
    """

    def __init__(self, om: Any, system: str | None, max_new_tokens: int | None,
                 options: dict[str, Any], chat_template: str | None = None) -> None:
        self.om, self.max_new_tokens, self.options = om, max_new_tokens, options
        self.chat_template = chat_template
        self.start = [] if system is None else [{"role": "system", "content": system}]
        self.messages = list(self.start)

    def reset(self) -> None:
        """Forget every turn; the system message stays."""
        self.messages = list(self.start)

    def reply(self, text: str, out: TextIO) -> str:
        """The assistant's reply to the user's ``text``, written to ``out`` as it is generated
        (then a newline); the turn joins the history once the reply is complete."""
        messages = [*self.messages, {"role": "user", "content": text}]
        stream = self.om.stream_chat(messages, max_new_tokens=self._budget(messages),
                                     chat_template=self.chat_template, **self.options)
        pieces = []
        for piece in stream:
            pieces.append(piece)
            out.write(piece)
            out.flush()
        out.write("\n")
        answer = "".join(pieces)
        self.messages = [*messages, {"role": "assistant", "content": answer}]
        return answer

    def _budget(self, messages: list[dict]) -> int:
        """--max-new-tokens, else the default bounded by the context the prompt leaves."""
        if self.max_new_tokens is not None:
            return self.max_new_tokens
        context = self.om.context_length
        if context is None:
            return DEFAULT_REPLY_TOKENS
        tokenizer = self.om.tokenizer
        prompt = tokenizer.apply_chat_template(messages, chat_template=self.chat_template)
        ids, _ = tokenizer.encode([prompt], add_special_tokens=False)
        used = ids.shape[1]
        budget = reply_budget(used, context)
        if budget < 1:
            raise InputError(f"The conversation takes {used} tokens, and the model's context holds "
                             f"{context}, so no reply fits; start a shorter conversation (/reset "
                             "in a session).")
        return budget


def chat(
    folder: Annotated[Path, typer.Argument(help="An export folder with a tokenizer and a chat template.")],
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
    provider: opts.ProviderOption = Provider.auto,
) -> None:
    """Chat with an export's model: --message turns, else a session (one line per turn)."""
    options = opts.given_options(
        min_new_tokens=min_new_tokens, do_sample=do_sample, temperature=temperature, top_k=top_k,
        top_p=top_p, min_p=min_p, repetition_penalty=repetition_penalty,
        no_repeat_ngram_size=no_repeat_ngram_size, eos_id=eos_id, stop=stop, seed=seed,
        response_format=response_format(json_object, json_schema, regex, choice))
    try:  # bad options, a missing tokenizer or template: refused before the first turn
        with warnings.catch_warnings():  # a turn warns about its options; once is enough
            warnings.simplefilter("ignore")
            generation_config(**options, max_new_tokens=DEFAULT_REPLY_TOKENS if max_new_tokens is None
                              else max_new_tokens)
        om = open_export(folder, provider)
        template = _template(chat_template)
        require(om.tokenizer, str(folder)).chat_template(template)
    except TransformerKitError as exc:
        fail(exc)
    conversation = Conversation(om, system, max_new_tokens, options, template)
    if message:
        for text in message:
            try:
                conversation.reply(text, sys.stdout)
            except TransformerKitError as exc:
                fail(exc)
        return
    terminal = sys.stdin.isatty()
    if terminal:
        console.print(f"Chatting with {folder} on {om.provider}. {HELP}", highlight=False, markup=False)
    converse(conversation, sys.stdout, terminal)


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


def converse(conversation: Conversation, out: TextIO, terminal: bool) -> None:
    """Read user turns from stdin until /exit, /quit or its end; /reset clears the history. An
    error in a turn prints its sentence and the session goes on. On a terminal: a "you> "
    prompt with line editing; Ctrl-C stops a reply (the turn is dropped) or, at the prompt,
    ends the session."""
    if terminal:
        with contextlib.suppress(ImportError):
            import readline  # noqa: F401  (line editing and history for input())
    while (text := _next_turn(out, terminal)) is not None and text not in EXIT:
        if text == RESET:
            conversation.reset()
            if terminal:
                console.print("(conversation cleared)", style="dim", highlight=False)
        elif text:
            _answer(conversation, text, out)


def _next_turn(out: TextIO, terminal: bool) -> str | None:
    """The user's next line (stripped), or None at the input's end (or Ctrl-C at the prompt)."""
    try:
        return input("you> " if terminal else "").strip()
    except (EOFError, KeyboardInterrupt):
        if terminal:
            out.write("\n")
        return None


def _answer(conversation: Conversation, text: str, out: TextIO) -> None:
    """The model's reply to ``text``; an error prints its sentence, Ctrl-C drops the turn."""
    try:
        conversation.reply(text, out)
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
