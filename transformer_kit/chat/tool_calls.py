"""Tool calls: which format a template asks the model to call tools in, the calls read back
from the model's text into OpenAI's ``tool_calls``, and the grammar that makes a forced call
always parse.

Formats: ``"hermes"``, the ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks
of Hermes and Qwen (2.5, 3) templates; ``"llama3"``, Llama 3.1/3.2's bare JSON object
``{"name": ..., "parameters": {...}}``, several separated by ``;``; ``"generic"``, the kit's own
for a template that renders no tools (:mod:`.tool_prompt` gives the model the tools): the JSON
object ``{"tool_call": {"name": ..., "arguments": {...}}}``, written as ``json.dumps`` writes it.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping
from typing import Any

from transformer_kit.core.decoding.response_format import grammar_of
from transformer_kit.core.errors import InputError

_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_PYTHON_TAG = "<|python_tag|>"


def call_format(template: str) -> str:
    """The tool-call format a chat template renders: ``"hermes"`` or ``"llama3"``."""
    if "<tool_call>" in template:
        return "hermes"
    if '"parameters"' in template or "<|python_tag|>" in template or "ipython" in template:
        return "llama3"
    return "hermes"


#: The key of a call in the generic format, and of a tool's result written back to the model.
GENERIC_CALL = "tool_call"
#: JSON as ``json.dumps`` writes it (what the model reads in the prompt is what it writes).
_SEPARATORS = {"item_separator": ", ", "key_separator": ": "}
_SHAPE = "{'type': 'function', 'function': {'name': ..., 'parameters': {...}}}"


def tool_names(tools: list[Mapping[str, Any]] | None) -> list[str]:
    """The function names of OpenAI-style tools (``{"type": "function", "function": {...}}``)
    or of bare function schemas (``{"name": ..., "parameters": ...}``). Raises InputError,
    naming the tool, for one without a name or whose ``parameters`` is no JSON schema of an
    object (a call's arguments are an object)."""
    names = []
    for i, tool in enumerate(tools or []):
        function = tool.get("function", tool) if isinstance(tool, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str) \
                or not function["name"]:
            raise InputError(f"A tool must be {_SHAPE}; tools[{i}] is {tool!r:.120}, which has no "
                             "name. Give each tool its function's name.")
        parameters = function.get("parameters")
        if parameters is not None and not isinstance(parameters, Mapping):
            raise InputError(f"tools[{i}] ({function['name']}) has parameters {parameters!r:.80}, "
                             "which is no JSON schema; give parameters as a schema of the "
                             "arguments' object, e.g. {'type': 'object', 'properties': {...}}, "
                             "or leave it out.")
        kind = (parameters or {}).get("type", "object")
        if kind != "object" and not (isinstance(kind, list) and "object" in kind):
            raise InputError(f"tools[{i}] ({function['name']}) has parameters of type {kind!r}; a "
                             "call's arguments are a JSON object: give parameters as {'type': "
                             "'object', 'properties': {...}}.")
        names.append(function["name"])
    return names


def _call(name: str, arguments: Any) -> dict[str, Any]:
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}}


def _as_call(data: Any, argument_keys: tuple[str, ...]) -> dict[str, Any] | None:
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return None
    for key in argument_keys:
        if key in data:
            arguments = data[key]
            if isinstance(arguments, str):  # some models write the arguments as a JSON string
                try:
                    arguments = json.loads(arguments)
                except json.JSONDecodeError:
                    return None
            return _call(data["name"], arguments) if isinstance(arguments, dict) else None
    return _call(data["name"], {})


def parse_tool_calls(text: str, fmt: str, names: list[str]) -> tuple[str | None, list[dict]]:
    """(content, tool_calls) of a reply: the text outside the calls (None when nothing is left)
    and the calls, each ``{"id", "type": "function", "function": {"name", "arguments"}}`` with
    the arguments as a JSON string (OpenAI's convention). Text that does not parse as a call of
    one of ``names`` stays content."""
    if fmt == "generic":
        return _generic_calls(text, names)
    calls: list[dict] = []
    if fmt == "hermes":
        def take(match: re.Match) -> str:
            try:
                call = _as_call(json.loads(match.group(1)), ("arguments", "parameters"))
            except json.JSONDecodeError:
                call = None
            if call is None or call["function"]["name"] not in names:
                return match.group(0)
            calls.append(call)
            return ""
        content = _HERMES.sub(take, text)
    else:
        content = text
        body = text.strip().removeprefix(_PYTHON_TAG).strip()
        parts = [p for p in body.split(";")] if body.startswith("{") else []
        parsed = []
        for part in parts:
            try:
                call = _as_call(json.loads(part), ("parameters", "arguments"))
            except json.JSONDecodeError:
                call = None
            if call is None or call["function"]["name"] not in names:
                parsed = []
                break
            parsed.append(call)
        if parsed:
            calls, content = parsed, ""
    content = content.strip() if calls else content
    return (content or None) if calls else content, calls


def _generic_calls(text: str, names: list[str]) -> tuple[str | None, list[dict]]:
    """(content, tool_calls) of a reply in the generic format: the JSON objects ``{"tool_call":
    {"name", "arguments"}}`` at its start (one a line), the text after them content."""
    decoder, calls = json.JSONDecoder(), []
    rest = text.strip()
    while rest.startswith("{"):
        try:
            data, end = decoder.raw_decode(rest)
        except json.JSONDecodeError:
            break
        call = (_as_call(data[GENERIC_CALL], ("arguments",))
                if isinstance(data, dict) and list(data) == [GENERIC_CALL] else None)
        if call is None or call["function"]["name"] not in names:
            break
        calls.append(call)
        rest = rest[end:].strip()
    return ((rest or None), calls) if calls else (text, [])


def _call_schemas(tools: list[Mapping[str, Any]], choice: str | None, key: str) -> list[dict]:
    """A JSON schema of one call (``{"name": NAME, key: arguments}``) per tool (the one named
    ``choice`` only, when it is not None)."""
    schemas = []
    for tool in tools:
        function = tool.get("function", tool)
        if choice is not None and function["name"] != choice:
            continue
        parameters = function.get("parameters") or {"type": "object"}
        schemas.append({"type": "object", "properties": {"name": {"const": function["name"]},
                                                         key: parameters},
                        "required": ["name", key], "additionalProperties": False})
    if not schemas:
        raise InputError(f"tool_choice names the function {choice!r}, which is not among the tools "
                         f"({', '.join(tool_names(tools))}); name one of them, or give 'required' "
                         "for a call to any.")
    return schemas


def forced_call_grammar(tools: list[Mapping[str, Any]], choice: str | None, fmt: str,
                        marker_ids: tuple[int, int] | None = None, *, opening: str | None = None,
                        or_text: bool = False) -> str:
    """A Lark grammar (llguidance's, with ``%json``) of one call to the tool named ``choice``
    (None: any of ``tools``), in ``fmt``: generation constrained by it always parses.
    ``marker_ids``: the ids of ``<tool_call>`` and ``</tool_call>`` where the tokenizer has them
    as single tokens (the model writes them so; spelled out otherwise). ``opening``: a Lark
    element the reply starts with (one that closes an open thinking block). ``or_text`` (the
    generic format only): a call, or plain text that does not start with ``{`` (``auto``).
    Raises InputError naming the tool whose parameters llguidance cannot hold a call to."""
    key = "parameters" if fmt == "llama3" else "arguments"
    schemas = _call_schemas(tools, choice, key)
    schema: dict[str, Any] = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    if fmt == "generic":
        schema = {"type": "object", "properties": {GENERIC_CALL: schema},
                  "required": [GENERIC_CALL], "additionalProperties": False}
    # lenient (unknown formats and keywords ignored, oneOf as anyOf), as response_format; compact,
    # except the generic format's, which is written as the prompt shows it (json.dumps' spaces)
    options = {"whitespace_flexible": False, "lenient": True, **(_SEPARATORS if fmt == "generic" else {})}
    body = f"%json {json.dumps({**schema, 'x-guidance': options})}"
    start = f"{opening} " if opening else ""
    if fmt == "hermes":
        left, right = ((f"<[{marker_ids[0]}]>", f"<[{marker_ids[1]}]>") if marker_ids
                       else ('"<tool_call>"', '"</tool_call>"'))
        grammar = f'start: {start}{left} "\\n" call "\\n" {right}\ncall: {body}\n'
    elif or_text:
        grammar = f"start: {start}call | {start}text\ncall: {body}\ntext: /[^{{][\\s\\S]*/\n"
    else:
        grammar = f"start: {start}call\ncall: {body}\n"
    _check_grammar(grammar, tools, choice, key)
    return grammar


def _check_grammar(grammar: str, tools: list[Mapping[str, Any]], choice: str | None, key: str) -> None:
    """Refuse, naming the tool, a grammar llguidance cannot compile (a tool's parameters that no
    schema reader takes, e.g. ``{"type": "frob"}``); compiled once, cached for generation."""
    try:
        grammar_of({"type": "grammar", "grammar": grammar})
    except InputError as refused:
        from llguidance import LLMatcher

        for tool in tools:
            function = tool.get("function", tool)
            if choice is not None and function["name"] != choice:
                continue
            try:
                error, messages = LLMatcher.validate_grammar_with_warnings(
                    LLMatcher.grammar_from_json_schema(function.get("parameters") or {},
                                                       defaults={"lenient": True}))
            except (ValueError, TypeError) as exc:
                error, messages = True, [str(exc)]
            if error:
                reason = (messages or ["refused by llguidance"])[0].rstrip(".")
                raise InputError(f"The parameters of the tool {function['name']!r} are not a JSON "
                                 f"schema a call can be held to ({reason}); give parameters as a "
                                 "JSON schema of the arguments' object, e.g. {'type': 'object', "
                                 "'properties': {'city': {'type': 'string'}}}.") from None
        raise refused
