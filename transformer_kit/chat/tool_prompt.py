"""Tools for a model whose chat template renders none (it never reads ``tools``): the kit writes
them into the conversation itself, after llama.cpp's generic tool-call handler.

- The tools reach the model in a system message (:func:`tools_text`): one JSON object a line,
  each tool's function as the request gave it, then the form of a call and what to answer. An
  existing first system message keeps its text, with the tools' after a blank line
  (:func:`with_system`); a template that refuses a system message gets the text before the
  first user message's instead (:func:`with_user`).
- A call is one JSON object, ``{"tool_call": {"name": ..., "arguments": {...}}}``, written as
  ``json.dumps`` writes it (the ``"generic"`` format of :mod:`.tool_calls`, which reads it
  back and holds a forced call to a grammar of it).
- The conversation's earlier calls and results are written in the same form
  (:func:`conversation`): an assistant message's ``tool_calls`` as call objects after its text,
  one a line; a ``tool`` message as a user message ``{"tool_result": {"name": ..., "content":
  ...}}`` (its content as JSON where it parses), consecutive results in one message, so
  templates that allow only user and assistant turns, alternating, still render it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from transformer_kit.chat.tool_calls import GENERIC_CALL

#: The key a tool's result is written under, in the user message that gives it back.
RESULT = "tool_result"
INTRO = ("You can call tools. Each tool is a JSON object on a line below: its name, what it does "
         "(description) and its parameters (a JSON schema of its arguments).")
FORM = ("To call a tool, answer with only a JSON object of this form:\n"
        '{"tool_call": {"name": "<the tool\'s name>", "arguments": {<its arguments>}}}\n'
        'A tool\'s result comes back as {"tool_result": {"name": ..., "content": ...}}.')
#: The last line of the tools' text, by ``tool_choice`` (a named function: :data:`NAMED`).
CLOSINGS = {"auto": "If no tool is needed, answer in plain text.",
            "required": "Answer now with a call to one of the tools."}
NAMED = "Answer now with a call to the tool {name}."


def _function(tool: Mapping[str, Any]) -> Any:
    """A tool's function object (OpenAI's ``{"type": "function", "function": {...}}``, or a bare
    function schema)."""
    return tool.get("function", tool)


def tools_text(tools: list[Mapping[str, Any]], choice: str) -> str:
    """The text that gives the model ``tools``: :data:`INTRO`, a blank line, each tool's
    function as JSON (``json.dumps(..., ensure_ascii=False)``, its keys as given) one a line, a
    blank line, :data:`FORM`, then :data:`CLOSINGS` of ``choice`` ("auto", "required") or
    :data:`NAMED` for a function's name."""
    lines = "\n".join(json.dumps(_function(tool), ensure_ascii=False) for tool in tools)
    closing = CLOSINGS.get(choice) or NAMED.format(name=choice)
    return f"{INTRO}\n\n{lines}\n\n{FORM}\n{closing}"


def with_system(messages: list[dict], text: str) -> list[dict]:
    """``messages`` with ``text`` in the system message: after the first message's text (and a
    blank line) when it is a system message holding text, else as a system message first."""
    first = messages[0] if messages else None
    if isinstance(first, Mapping) and first.get("role") == "system" and isinstance(first.get("content"), str):
        return [{**first, "content": f"{first['content']}\n\n{text}"}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def with_user(messages: list[dict], text: str) -> list[dict] | None:
    """``messages`` with ``text`` (and a blank line) before the first user message's text, for
    a template that takes no system message; None when there is no such message."""
    for i, message in enumerate(messages):
        if isinstance(message, Mapping) and message.get("role") == "user" \
                and isinstance(message.get("content"), str):
            return [*messages[:i], {**message, "content": f"{text}\n\n{message['content']}"},
                    *messages[i + 1:]]
    return None


def _as_json(value: Any) -> Any:
    """A JSON string's value (a call's arguments, a tool's result), else ``value`` as it is."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


def call_text(call: Any) -> str:
    """One earlier tool call (OpenAI's ``{"id", "type", "function": {"name", "arguments"}}``) as
    the generic format writes it: ``{"tool_call": {"name": ..., "arguments": {...}}}``."""
    function = call.get("function", call) if isinstance(call, Mapping) else {}
    function = function if isinstance(function, Mapping) else {}
    body = {"name": function.get("name"), "arguments": _as_json(function.get("arguments", {}))}
    return json.dumps({GENERIC_CALL: body}, ensure_ascii=False)


def result_text(message: Mapping[str, Any], names: Mapping[str, str]) -> str:
    """A ``tool`` message as ``{"tool_result": {"name": ..., "content": ...}}``: the name its
    ``name`` gives, else the call its ``tool_call_id`` answers (``names``: call id -> name),
    else none; the content as JSON where it parses."""
    call_id = message.get("tool_call_id")
    name = message.get("name") or (names.get(call_id) if isinstance(call_id, str) else None)
    body = ({"name": name} if name else {}) | {"content": _as_json(message.get("content"))}
    return json.dumps({RESULT: body}, ensure_ascii=False)


def has_tool_turns(messages: list[dict]) -> bool:
    """Whether ``messages`` hold a tool call or a tool's result."""
    return any(isinstance(m, Mapping) and (m.get("role") == "tool" or m.get("tool_calls"))
               for m in messages)


def conversation(messages: list[dict]) -> list[dict]:
    """``messages`` with their tool calls and results written as text (see the module): what a
    template that knows no tools renders as it renders any conversation."""
    out: list[dict] = []
    names: dict[str, str] = {}
    results = False  # whether the last message written holds tool results
    for message in messages:
        if not isinstance(message, Mapping):
            out.append(message)  # the template's rendering refuses it with a sentence
            results = False
            continue
        calls = message.get("tool_calls")
        if message.get("role") == "assistant" and isinstance(calls, list) and calls \
                and (message.get("content") is None or isinstance(message.get("content"), str)):
            for call in calls:
                function = call.get("function") if isinstance(call, Mapping) else None
                if isinstance(function, Mapping) and isinstance(call.get("id"), str) \
                        and isinstance(function.get("name"), str):
                    names[call["id"]] = function["name"]
            said = [message["content"]] if message.get("content") else []
            fields = {k: v for k, v in message.items() if k != "tool_calls"}
            out.append({**fields, "content": "\n".join(said + [call_text(c) for c in calls])})
            results = False
        elif message.get("role") == "tool":
            line = result_text(message, names)
            if results:
                out[-1] = {**out[-1], "content": f"{out[-1]['content']}\n{line}"}
            else:
                out.append({"role": "user", "content": line})
            results = True
        else:
            out.append(message)
            results = False
    return out
