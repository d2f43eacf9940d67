"""A conversation with a model, the same for every runtime: the messages rendered by the model's
chat template, the reply generated until the end of the turn, and read back as the assistant's
message (its text, and the tools it called)."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from transformer_kit.chat import reasoning, tool_calls, tool_prompt
from transformer_kit.core.errors import ChatTemplateError, InputError

_READS_TOOLS = re.compile(r"\btools\b")

#: How a tool may be chosen (OpenAI's ``tool_choice``): a name, or {"type": "function",
#: "function": {"name": ...}}.
TOOL_CHOICES = ("auto", "none", "required")
#: Tokens a reply may take when the caller sets no bound (fewer when the context has less left).
DEFAULT_REPLY_TOKENS = 256


def reply_budget(prompt_tokens: int, context_length: int | None) -> int:
    """The tokens a reply may take when the caller sets no bound: :data:`DEFAULT_REPLY_TOKENS`,
    or the room the context leaves after a prompt of ``prompt_tokens`` when that is less (0 or
    less: no room)."""
    if context_length is None:
        return DEFAULT_REPLY_TOKENS
    return min(DEFAULT_REPLY_TOKENS, context_length - prompt_tokens)


def _tool_choice(tool_choice: Any, tools: list | None) -> str | None:
    """"auto" / "none" / "required" or the forced function's name."""
    if tool_choice is None:
        return "auto"
    if isinstance(tool_choice, str) and tool_choice in TOOL_CHOICES:
        choice = tool_choice
    elif isinstance(tool_choice, dict) and isinstance(tool_choice.get("function"), dict):
        choice = tool_choice["function"].get("name")
        if not isinstance(choice, str):
            raise InputError(f"tool_choice {tool_choice!r} names no function; give "
                             "{'type': 'function', 'function': {'name': ...}}.")
    else:
        raise InputError(f"tool_choice={tool_choice!r} is not allowed; give 'auto', 'none', "
                         "'required' or {'type': 'function', 'function': {'name': ...}}.")
    if choice not in ("auto", "none") and not tools:
        raise InputError(f"tool_choice={tool_choice!r} needs tools; pass tools=[...] or leave "
                         "tool_choice out.")
    return choice


def _call_with_object(call: Any) -> Any:
    """A tool call with its ``arguments`` (a JSON string in OpenAI's convention) as the object a
    template's ``arguments | tojson`` expects; arguments that are no JSON object stay as given."""
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("arguments"), str):
        return call
    try:
        arguments = json.loads(function["arguments"]) if function["arguments"].strip() else {}
    except json.JSONDecodeError:
        return call
    return {**call, "function": {**function, "arguments": arguments}} if isinstance(arguments, dict) else call


def with_argument_objects(messages: list[dict]) -> list[dict]:
    """``messages`` with each assistant tool call's arguments parsed from OpenAI's JSON string
    into an object, as vLLM does: transformers hands messages to the template as they are, and
    the templates of Qwen 2.5, Llama 3.1 and Hermes render ``arguments | tojson``, which writes
    a string as a quoted string (the model was trained on the object)."""
    return [{**m, "tool_calls": [_call_with_object(c) for c in m["tool_calls"]]}
            if isinstance(m, dict) and isinstance(m.get("tool_calls"), list) else m for m in messages]


def check_switches(template: str, template_kwargs: dict | None) -> None:
    """Refuse a thinking switch (``enable_thinking``, ``reasoning_effort``) the template never
    reads, or a value it does not take: the request would believe it took effect."""
    for key, allowed in reasoning.SWITCHES.items():
        if key not in (template_kwargs or {}):
            continue
        value = template_kwargs[key]
        if not re.search(rf"\b{key}\b", template):
            raise InputError(f"{key}={value!r} was given, but this model's chat template has no such "
                             f"switch (it never reads '{key}'); leave {key} out for this model.")
        if value not in allowed or type(value) is not type(allowed[0]):
            raise InputError(f"{key}={value!r} is not allowed; give one of "
                             f"{', '.join(repr(a) for a in allowed)}.")


#: The template variables a turn sets itself, from its own arguments (the conversation, the tools,
#: the template, the special tokens): ``template_kwargs`` may not give them.
OWN_VARIABLES = ("messages", "tools", "chat_template", "template", "special_tokens")


def check_variables(template_kwargs: dict | None) -> None:
    """Refuse template variables that would replace the turn's own (:data:`OWN_VARIABLES`)."""
    taken = [key for key in OWN_VARIABLES if key in (template_kwargs or {})]
    if taken:
        raise InputError(f"The template variables (chat_template_kwargs) may not set "
                         f"{', '.join(repr(k) for k in taken)}: the conversation, tools and template "
                         "are given by the request's own fields (messages, tools); leave "
                         f"{'them' if len(taken) > 1 else 'it'} out of the template variables.")


class ChatTurn:
    """One assistant turn being prepared: the prompt's text and the generation options.

    A template that never reads ``tools`` gets them from the kit (:mod:`.tool_prompt`: a system
    message, calls as ``{"tool_call": ...}`` objects): a forced call is held to a grammar of one
    call, ``auto`` to a grammar of a call or plain text.

    Args:
        tokenizer: the model's ``TextTokenizer`` (it holds the chat templates), or None.
        messages: the conversation so far, OpenAI-style dicts.
        tools: functions the model may call (JSON schemas), rendered by the template (by the
            kit where the template renders none).
        tool_choice: "auto" (the model decides), "none", "required" (a call, constrained to
            parse) or a function named as OpenAI names it.
        chat_template: a template's name or text instead of the default.
        template_kwargs: further variables for the template.
        options: generation options (``max_new_tokens``, ``do_sample``, ``response_format``...).
    """

    def __init__(self, tokenizer: Any, messages: list[dict], *,
                 tools: list[dict] | None = None, tool_choice: Any = None,
                 chat_template: str | None = None, template_kwargs: dict | None = None,
                 options: dict[str, Any]) -> None:
        if tokenizer is None:
            raise InputError("This model has no tokenizer (no tokenizer.json came with it), so it "
                             "cannot render a conversation; load a checkpoint folder that holds "
                             "tokenizer.json and a chat template.")
        self.tokenizer = tokenizer
        self.choice = _tool_choice(tool_choice, tools)
        self.tools = None if self.choice == "none" else tools
        self.names = tool_calls.tool_names(self.tools)
        template = tokenizer.chat_template(chat_template, self.tools)
        check_variables(template_kwargs)
        check_switches(template, template_kwargs)
        #: The template's reasoning markup ("think", "harmony") or None.
        self.reasoning = reasoning.reasoning_format(template)
        #: Whether the template renders no tools, so the kit writes them (:mod:`.tool_prompt`).
        self.generic = self.reasoning != "harmony" and not _READS_TOOLS.search(template)
        self.format = ("harmony" if self.reasoning == "harmony" else "generic" if self.generic
                       else tool_calls.call_format(template))
        if self.reasoning == "harmony":  # gpt-oss's template reads an earlier thinking as `thinking`
            messages = [{**m, "thinking": m["reasoning_content"]}
                        if isinstance(m, dict) and m.get("reasoning_content") and "thinking" not in m
                        else m for m in messages]
        if self.generic and tool_prompt.has_tool_turns(messages):
            messages = tool_prompt.conversation(messages)
        self.prompt = self._render(messages, template, template_kwargs)
        if options.get("num_return_sequences", 1) != 1 or options.get("num_beams", 1) != 1:
            raise InputError("A chat turn is one reply; num_return_sequences and num_beams must be 1 "
                             "(call generate on apply_chat_template's prompt for several).")
        #: Whether the prompt leaves a <think> block open (the reply starts in the thinking).
        self.thinking = self.reasoning == "think" and reasoning.opens_thinking(self.prompt)
        self.options = dict(options)
        if self.choice not in ("auto", "none") and self.format == "harmony":
            raise InputError(f"tool_choice={tool_choice!r} cannot be forced with this model's "
                             "harmony chat template (its calls are written in the commentary "
                             "channel); give tool_choice 'auto' or leave it out.")
        if self.choice not in ("auto", "none"):
            if self.options.get("response_format") is not None:
                raise InputError("response_format and a forced tool call (tool_choice "
                                 f"{tool_choice!r}) both constrain the reply; give one of them.")
            markers = (tokenizer.token_id("<tool_call>"), tokenizer.token_id("</tool_call>"))
            grammar = tool_calls.forced_call_grammar(
                self.tools, None if self.choice == "required" else self.choice, self.format,
                None if None in markers else markers, opening=self._thinking_closed())
            self.options["response_format"] = {"type": "grammar", "grammar": grammar}
        elif self.generic and self.tools and not self.thinking \
                and self.options.get("response_format") is None:
            # auto: a reply that starts a call ends it, valid; any other reply is free text
            grammar = tool_calls.forced_call_grammar(self.tools, None, "generic", or_text=True)
            self.options["response_format"] = {"type": "grammar", "grammar": grammar}

    def _render(self, messages: list[dict], template: str, template_kwargs: dict | None) -> str:
        """The prompt: ``messages`` rendered by ``template``, with the tools' text in them where
        the template renders no tools (before the first user message's text where it refuses a
        system message)."""
        if not (self.generic and self.tools):
            return self._rendered(messages, template, template_kwargs)
        text = tool_prompt.tools_text(self.tools, self.choice)
        try:
            return self._rendered(tool_prompt.with_system(messages, text), template, template_kwargs)
        except ChatTemplateError:
            placed = tool_prompt.with_user(messages, text)
            if placed is None or (messages and isinstance(messages[0], dict)
                                       and messages[0].get("role") == "system"):
                raise  # the template refuses the conversation as it was given too
            return self._rendered(placed, template, template_kwargs)

    def _rendered(self, messages: list[dict], template: str, template_kwargs: dict | None) -> str:
        objects = with_argument_objects(messages)
        try:
            return self.tokenizer.apply_chat_template(objects, tools=self.tools, chat_template=template,
                                                      **(template_kwargs or {}))
        except ChatTemplateError:  # a template that joins the arguments as text: as given
            if objects == messages:
                raise
            return self.tokenizer.apply_chat_template(messages, tools=self.tools,
                                                      chat_template=template, **(template_kwargs or {}))

    def _thinking_closed(self) -> str | None:
        """A forced call's opening where the prompt leaves a ``<think>`` block open (the R1
        distills'): ``</think>`` and a blank line, so the call is the answer, not the thinking
        (None: the prompt leaves none open)."""
        if not self.thinking:
            return None
        close = self.tokenizer.token_id("</think>")  # one token where the tokenizer has it
        marker = '"</think>"' if close is None else f"<[{close}]>"
        return f'{marker} "\\n\\n"'

    def splitter(self) -> reasoning.Splitter | None:
        """A reader of the reply's pieces into reasoning and content (None: the template does
        not reason)."""
        return reasoning.Splitter(self.reasoning, self.thinking) if self.reasoning else None

    def message(self, text: str) -> dict[str, Any]:
        """The assistant's message for the generated ``text``: ``{"role": "assistant",
        "content": ...}`` plus ``tool_calls`` when it called tools, plus ``reasoning_content``
        (the thinking, None when the reply did not think) when the template reasons."""
        if self.reasoning is not None:
            return self._reasoned(text)
        if not self.names:
            return {"role": "assistant", "content": text}
        content, calls = tool_calls.parse_tool_calls(text, self.format, self.names)
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = calls
        return message

    def _reasoned(self, text: str) -> dict[str, Any]:
        read = reasoning.split(text, self.reasoning, self.thinking)
        content: str | None = read.content
        calls: list[dict] = []
        if self.names and self.format == "harmony":
            calls = [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                      "function": {"name": name, "arguments": arguments.strip()}}
                     for name, arguments in read.calls]
            content = (content.strip() or None) if calls else content
        elif self.names:
            content, calls = tool_calls.parse_tool_calls(content, self.format, self.names)
        message: dict[str, Any] = {"role": "assistant", "content": content,
                                   "reasoning_content": read.reasoning}
        if calls:
            message["tool_calls"] = calls
        return message
