"""Tool calls: which format a template asks the model to call tools in, the calls read back
from the model's text into OpenAI's ``tool_calls``, and the grammar that makes a forced call
always parse.

Formats: ``"hermes"``, the ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks
of Hermes and Qwen (2.5, 3) templates; ``"llama3"``, Llama 3.1/3.2's bare JSON object
``{"name": ..., "parameters": {...}}``, several separated by ``;``.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping
from typing import Any

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


def tool_names(tools: list[Mapping[str, Any]] | None) -> list[str]:
    """The function names of OpenAI-style tools (``{"type": "function", "function": {...}}``)
    or of bare function schemas (``{"name": ..., "parameters": ...}``)."""
    names = []
    for tool in tools or []:
        function = tool.get("function", tool) if isinstance(tool, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise InputError(f"A tool must be {{'type': 'function', 'function': {{'name': ..., "
                             f"'parameters': {{...}}}}}}; got {tool!r:.120}.")
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


def forced_call_grammar(tools: list[Mapping[str, Any]], choice: str | None, fmt: str,
                        marker_ids: tuple[int, int] | None = None) -> str:
    """A Lark grammar (llguidance's, with ``%json``) of one call to the tool named ``choice``
    (None: any of ``tools``), in ``fmt``: generation constrained by it always parses.
    ``marker_ids``: the ids of ``<tool_call>`` and ``</tool_call>`` where the tokenizer has them
    as single tokens (the model writes them so; spelled out otherwise)."""
    schemas = []
    for tool in tools:
        function = tool.get("function", tool)
        if choice is not None and function["name"] != choice:
            continue
        parameters = function.get("parameters") or {"type": "object"}
        key = "parameters" if fmt == "llama3" else "arguments"
        schemas.append({"type": "object", "properties": {"name": {"const": function["name"]},
                                                         key: parameters},
                        "required": ["name", key], "additionalProperties": False})
    if not schemas:
        raise InputError(f"tool_choice names the function {choice!r}, which is not among the tools "
                         f"({', '.join(tool_names(tools))}).")
    schema = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    # compact, and lenient (unknown formats and keywords ignored, oneOf as anyOf), as response_format
    schema = {**schema, "x-guidance": {"whitespace_flexible": False, "lenient": True}}
    body = f"%json {json.dumps(schema)}"
    if fmt == "hermes":
        left, right = ((f"<[{marker_ids[0]}]>", f"<[{marker_ids[1]}]>") if marker_ids
                       else ('"<tool_call>"', '"</tool_call>"'))
        return f'start: {left} "\\n" call "\\n" {right}\ncall: {body}\n'
    return f"start: call\ncall: {body}\n"
