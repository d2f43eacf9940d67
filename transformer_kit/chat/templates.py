"""A checkpoint's chat templates: found where transformers finds them, chosen as it chooses, and
rendered as its ``apply_chat_template`` renders them (in :mod:`.sandbox`).

Where they are read from, in transformers' order of priority: ``chat_template.jinja`` (the
default) and ``additional_chat_templates/NAME.jinja`` (named ones); without those,
``tokenizer_config.json``'s ``chat_template``, a string or a list of ``{"name", "template"}``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from transformer_kit.chat import sandbox
from transformer_kit.core.errors import ChatTemplateError

TEMPLATE_FILE = "chat_template.jinja"
TEMPLATE_FOLDER = "additional_chat_templates"
#: The named special tokens a template sees by name (transformers' SPECIAL_TOKENS_ATTRIBUTES).
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                       "mask_token")
#: Fields a message's reasoning may come under; templates read the first (as transformers).
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


def is_template_file(name: str) -> bool:
    """Whether the tokenizer file ``name`` (relative path) is a chat template file."""
    return name == TEMPLATE_FILE or (name.startswith(f"{TEMPLATE_FOLDER}/") and name.endswith(".jinja"))


def _json(files: Mapping[str, bytes], name: str) -> dict[str, Any]:
    if name not in files:
        return {}
    try:
        data = json.loads(files[name].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def read_templates(files: Mapping[str, bytes]) -> dict[str, str]:
    """Template name -> text from a tokenizer's files (``"default"`` for the unnamed one)."""
    templates = {}
    if TEMPLATE_FILE in files:
        templates["default"] = files[TEMPLATE_FILE].decode("utf-8")
    for name, data in sorted(files.items()):
        if name.startswith(f"{TEMPLATE_FOLDER}/") and name.endswith(".jinja"):
            templates[name[len(TEMPLATE_FOLDER) + 1:-len(".jinja")]] = data.decode("utf-8")
    if templates:
        return templates
    given = _json(files, "tokenizer_config.json").get("chat_template")
    if isinstance(given, str):
        return {"default": given}
    if isinstance(given, list):
        return {t["name"]: t["template"] for t in given
                if isinstance(t, dict) and isinstance(t.get("name"), str)
                and isinstance(t.get("template"), str)}
    return {}


def read_special_tokens(files: Mapping[str, bytes]) -> dict[str, str]:
    """``bos_token``, ``eos_token``, ... -> their text, as transformers reads them: from
    tokenizer_config.json, overridden by special_tokens_map.json when the config has no
    ``added_tokens_decoder`` (its legacy rule)."""
    config = _json(files, "tokenizer_config.json")
    values = {name: config.get(name) for name in SPECIAL_TOKEN_NAMES}
    if "added_tokens_decoder" not in config:
        legacy = _json(files, "special_tokens_map.json")
        values.update({name: legacy[name] for name in SPECIAL_TOKEN_NAMES if name in legacy})
    tokens = {}
    for name, value in values.items():
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            tokens[name] = value
    return tokens


def choose(templates: dict[str, str], name: str | None, tools: list | None) -> str:
    """The template to render: ``name`` (a template's name, or a template's text), else
    ``tool_use`` when tools are given and it exists, else the default (transformers' rule)."""
    if name is not None:
        if name in templates:
            return templates[name]
        if "{{" in name or "{%" in name:  # a template's own text
            return name
        raise ChatTemplateError(f"chat_template={name!r} names no template of this model; its "
                                f"templates are {', '.join(sorted(templates)) or 'none'} (or pass "
                                "a template's text).")
    if not templates:
        raise ChatTemplateError("This model has no chat template (no chat_template.jinja, no "
                                "chat_template in tokenizer_config.json), so it cannot render a "
                                "conversation. Pass chat_template=... with the model's format, or "
                                "generate from a prompt you write.")
    if len(templates) == 1 and "default" in templates:
        return templates["default"]
    if tools is not None and "tool_use" in templates:
        return templates["tool_use"]
    if "default" in templates:
        return templates["default"]
    raise ChatTemplateError(f"This model has several chat templates ({', '.join(sorted(templates))}) "
                            "and none is the default; choose one with chat_template=NAME.")


#: Subclasses of the plain scalar types (an IntEnum, a str subclass) -> the plain value (bool
#: before int: a bool is an int).
_SCALARS = ((bool, bool), (str, str.__str__), (int, int.__int__), (float, float.__float__))


def plain(value: Any) -> Any:
    """``value`` rebuilt from plain JSON types (what a template may see, as transformers): strings,
    numbers, booleans, None, dicts, lists and tuples; dataclasses and pydantic models as dicts;
    anything else as a placeholder ``<TypeName>``, so no object with methods reaches the sandbox."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    for kind, convert in _SCALARS:
        if isinstance(value, kind):
            return convert(value)
    if isinstance(value, Mapping):
        return {plain(k): plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(plain(v) for v in value)
    return _plain_object(value)


def _plain_object(value: Any) -> Any:
    """:func:`plain` of a value that is no JSON type: a numpy scalar's value, a dataclass's or a
    pydantic model's fields as a dict, else the placeholder ``<TypeName>``."""
    if hasattr(value, "item") and hasattr(value, "dtype") and getattr(value, "ndim", None) == 0:
        return plain(value.item())  # numpy scalars
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):
        return plain(value.model_dump())
    return f"<{type(value).__name__}>"


def _with_reasoning_aliases(messages: list[dict]) -> list[dict]:
    out = []
    for message in messages:
        reasoning = next((message[k] for k in _REASONING_FIELDS if message.get(k) is not None), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        out.append(message)
    return out


def _check_conversation(messages: Any, tools: Any, documents: Any, add_generation_prompt: bool,
                        continue_final_message: bool | str) -> None:
    """Raise :class:`ChatTemplateError` for what :func:`render_conversation` cannot render:
    no messages, a message or tool or document that is not a dict, or both a generation prompt
    and a continued final message."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ChatTemplateError(f"A conversation is a non-empty list of messages ({{'role': ..., "
                                f"'content': ...}}), got {messages!r:.80}.")
    if continue_final_message and add_generation_prompt:
        raise ChatTemplateError("continue_final_message and add_generation_prompt do not go together: "
                                "continue the last message, or start a new assistant message.")
    bad = [i for i, m in enumerate(messages) if not isinstance(m, Mapping)]
    if bad:
        raise ChatTemplateError(f"Messages {bad} are not dicts; give each as {{'role': ..., "
                                "'content': ...}.")
    if tools is not None and (not isinstance(tools, (list, tuple))
                              or not all(isinstance(t, Mapping) for t in tools)):
        raise ChatTemplateError("tools must be a list of JSON schemas (dicts), e.g. {'type': "
                                "'function', 'function': {'name': ..., 'parameters': {...}}}.")
    if documents is not None and (not isinstance(documents, (list, tuple))
                                  or not all(isinstance(d, Mapping) for d in documents)):
        raise ChatTemplateError("documents must be a list of dicts with 'title' and 'text' keys.")


def _mark_final_message(chat: list[dict], template: str, continue_final_message: bool | str) -> Any:
    """Append the continuation tag to the text the final message of ``chat`` continues (its
    ``continue_final_message`` field, ``content`` when True: a string, or a list's last text
    block); returns that text as it was."""
    field = continue_final_message if isinstance(continue_final_message, str) else "content"
    final = chat[-1].get(field)
    if final is None:
        raise ChatTemplateError(f"continue_final_message is set but the final message has no "
                                f"{field!r} to continue.")
    fields = ([f for f in _REASONING_FIELDS if chat[-1].get(f) == final]
              if field in _REASONING_FIELDS else [field])
    if not any(f in template for f in fields):
        raise ChatTemplateError(f"continue_final_message is set to {field!r}, which this chat "
                                "template does not read.")
    if isinstance(final, (list, tuple)):
        for block in reversed(final):
            if isinstance(block, dict) and "text" in block:
                final = block["text"]
                block["text"] = block["text"] + _CONTINUE_TAG
                break
        else:
            raise ChatTemplateError("continue_final_message is set but the final message has "
                                    "no text to continue.")
    else:
        for f in fields:
            chat[-1][f] = chat[-1][f] + _CONTINUE_TAG
    return final


def _cut_at_continuation(rendered: str, final: str) -> str:
    """``rendered`` up to where the final message's text ends (where the tag was)."""
    tag = _CONTINUE_TAG.strip()
    if final.strip() not in rendered or tag not in rendered:
        raise ChatTemplateError("continue_final_message is set but the template does not show "
                                "the final message as given, so it cannot be continued.")
    at = rendered.rindex(tag)
    return (rendered[:at] if rendered[at:at + len(_CONTINUE_TAG)] == _CONTINUE_TAG
            else rendered[:at].rstrip())


def render_conversation(template: str, messages: list, *, special_tokens: Mapping[str, str],
                        tools: list | None = None, documents: list | None = None,
                        add_generation_prompt: bool = False,
                        continue_final_message: bool | str = False, **kwargs: Any) -> str:
    """``messages`` rendered by ``template`` as transformers' ``apply_chat_template(...,
    tokenize=False)`` renders them: fields whose value is None dropped, everything made plain,
    reasoning fields aliased, the special tokens by name (keyword arguments win), and the final
    message left open with ``continue_final_message``.
    """
    _check_conversation(messages, tools, documents, add_generation_prompt, continue_final_message)
    chat = plain([{k: v for k, v in m.items() if v is not None} for m in messages])
    chat = _with_reasoning_aliases(chat)
    final = _mark_final_message(chat, template, continue_final_message) if continue_final_message else None
    variables = {**plain(dict(special_tokens)), **plain(kwargs), "messages": chat,
                 "tools": plain(tools), "documents": plain(documents),
                 "add_generation_prompt": add_generation_prompt}
    rendered = sandbox.render(sandbox.compile_template(template), variables)
    if final is not None:
        rendered = _cut_at_continuation(rendered, final)
    return rendered
