"""``POST /v1/responses``, OpenAI's Responses API, over the runtime's
:meth:`~transformer_kit.runtime.Service.chat` (the path of ``/v1/chat/completions``): the
request's ``input`` (text, or messages and function-call items) and ``instructions`` become
chat messages, rendered by the export's chat template; the reply comes back as ``output``
items, a ``message`` with ``output_text`` and ``function_call`` items.

Function ``tools`` and ``tool_choice`` are given in the Responses shape (``{"type":
"function", "name", "parameters"}``), ``text.format`` (``json_schema``, ``json_object``)
constrains the reply through the same grammar as chat's ``response_format``. With ``stream``
the reply is sent as the Responses events (``response.created``, ``response.in_progress``,
``response.output_item.added``, ``response.content_part.added``,
``response.output_text.delta``... ``response.completed``, or ``response.incomplete`` for a reply
cut at ``max_output_tokens``); when the model may call tools the text is held back to the end,
as chat does. ``previous_response_id`` continues a conversation this server stored
(:class:`.ResponseStore`: the last N responses, in memory). The options beyond the
conversation (``include``, ``truncation``, ``reasoning``, the prompt cache's hints,
``service_tier``, ``stream_options``...) are :mod:`.response_options`'s, which serves them or
refuses a value by name with the reason. Errors are the other endpoints'.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any, ClassVar, Literal

from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field

from transformer_kit.apps.serving import response_options as options
from transformer_kit.apps.serving.chat import ContentLogprob
from transformer_kit.apps.serving.logprobs import TokenWriter, chat_content
from transformer_kit.apps.serving.openai_api import ServerMetrics, error_response, failure_event
from transformer_kit.apps.serving.response_store import ResponseStore, UnknownResponse
from transformer_kit.apps.serving.routes import Family, Served, endpoint, settled, streamed
from transformer_kit.core.decoding.logprobs import TokenLogprob
from transformer_kit.core.errors import InputError
from transformer_kit.runtime.request_options import RequestOptions
from transformer_kit.runtime.service import sampling
from transformer_kit.runtime.text_stream import TextStream, Usage

#: The input items this server takes, by type (a message may leave its type out).
_ITEMS = ("message", "function_call", "function_call_output")
_ROLES = ("user", "system", "developer", "assistant")
#: The text content parts a message may hold (a model's own turn comes back as output_text).
_TEXT_PARTS = ("input_text", "output_text", "text")


class TextConfig(BaseModel):
    """``text``: the reply's ``format`` ({"type": "text"}, "json_object" or "json_schema") and
    ``verbosity`` ("medium", the model's own, only)."""

    model_config = ConfigDict(extra="forbid")

    format: dict[str, Any] | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ResponsesRequest(BaseModel):
    """The body of ``POST /v1/responses``: OpenAI's fields this server honours (the options
    beyond the conversation in :mod:`.response_options`, which refuses the values it cannot
    serve); any other field (``background``, ``conversation``, ``prompt``...) is refused (400),
    so a client never believes an option took effect when it did not."""

    model_config = ConfigDict(extra="forbid")
    #: OpenAI's fields this server refuses by name, with the reason (install_error_handlers).
    refused_fields: ClassVar[dict[str, str]] = options.NOT_SERVED

    model: str
    input: str | list[Any]
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    text: TextConfig | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    stream: bool | None = False
    stream_options: options.StreamOptions | None = None
    store: bool | None = None
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    include: list[str] | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    truncation: Literal["auto", "disabled"] | None = None
    reasoning: options.ReasoningConfig | None = None
    #: A hint for OpenAI's cache routing; the prefix cache matches any prompt's prefix anyway.
    prompt_cache_key: str | None = None
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None
    #: An identifier of the end user, as ``user`` (kept in the response, not used).
    safety_identifier: str | None = None


def _content(content: Any, where: str) -> Any:
    """A message's content as chat's: a string, or its text parts as chat text parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InputError(f"{where}.content is {type(content).__name__}; give it as a string or a "
                         "list of parts {'type': 'input_text', 'text': ...}.")
    parts = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
        if kind not in _TEXT_PARTS or not isinstance(part.get("text"), str):
            raise InputError(f"{where}.content[{i}] is a part of type {kind!r}; this server takes "
                             "text only: give content as a string or as parts {'type': "
                             "'input_text', 'text': ...}.")
        parts.append({"type": "text", "text": part["text"]})
    return parts


def _field(item: dict[str, Any], name: str, where: str) -> str:
    if not isinstance(item.get(name), str):
        raise InputError(f"{where} ({item['type']}) has no {name!r} string; give it, as in the "
                         "function_call item the model answered.")
    return item[name]


def input_messages(given: str | list[Any]) -> list[dict[str, Any]]:
    """The chat messages of a request's ``input``: text is one user message; items are
    messages, ``function_call`` items (joined to the assistant message before them, as chat's
    ``tool_calls``) and ``function_call_output`` items (chat's ``tool`` messages). Raises
    InputError for an empty input or an item this server does not take."""
    if isinstance(given, str):
        return [{"role": "user", "content": given}]
    if not given:
        raise InputError("input is empty; give text, or a list of at least one item, e.g. "
                         "[{'role': 'user', 'content': 'Hello'}].")
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(given):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise InputError(f"{where} is a {type(item).__name__}; give input as text, or as a list "
                             "of items, e.g. {'role': 'user', 'content': 'Hello'}.")
        kind = item.get("type", "message")
        if kind not in _ITEMS:
            raise InputError(f"{where} is an item of type {kind!r}; this server takes "
                             f"{', '.join(_ITEMS)} items.")
        if kind == "message":
            if item.get("role") not in _ROLES:
                raise InputError(f"{where}.role is {item.get('role')!r}; a message's role is one "
                                 f"of {', '.join(_ROLES)}.")
            messages.append({"role": item["role"], "content": _content(item.get("content"), where)})
        elif kind == "function_call":
            call = {"id": _field(item, "call_id", where), "type": "function",
                    "function": {"name": _field(item, "name", where),
                                 "arguments": _field(item, "arguments", where)}}
            last = messages[-1] if messages else None
            if last is None or last["role"] != "assistant":
                last = {"role": "assistant", "content": None}
                messages.append(last)
            last.setdefault("tool_calls", []).append(call)
        else:
            output = item.get("output")
            content = output if isinstance(output, str) else _content(output, where)
            messages.append({"role": "tool", "tool_call_id": _field(item, "call_id", where),
                             "content": content})
    return messages


#: The fields of a function tool this server reads; ``strict`` is accepted (a forced call,
#: tool_choice "required" or a named function, follows the parameters' schema by grammar).
_TOOL_FIELDS = ("type", "name", "description", "parameters", "strict")


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Function tools in chat's shape (``{"type": "function", "function": {...}}``)."""
    if tools is None:
        return None
    out = []
    for i, tool in enumerate(tools):
        if tool.get("type") != "function" or not isinstance(tool.get("name"), str):
            raise InputError(f"tools[{i}] is a tool of type {tool.get('type')!r}"
                             f"{'' if tool.get('type') != 'function' else ' without a name'}; this "
                             "server calls function tools only: {'type': 'function', 'name': ..., "
                             "'parameters': {...}}.")
        # a field this server would not act on (defer_loading, output_schema...) is refused
        other = [key for key in tool if key not in _TOOL_FIELDS]
        if other:
            raise InputError(f"tools[{i}] ({tool['name']!r}) has {', '.join(map(repr, other))}, which "
                             f"this server does not act on; a function tool takes "
                             f"{', '.join(_TOOL_FIELDS)}: leave the others out.")
        out.append({"type": "function", "function": {
            key: tool[key] for key in ("name", "description", "parameters") if key in tool}})
    return out


def chat_tool_choice(choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    """``tool_choice`` in chat's shape: "auto", "none", "required", or one function by name."""
    if choice is None or choice in ("auto", "none", "required"):
        return choice
    named = isinstance(choice, dict) and choice.get("type") == "function"
    if not named or not isinstance(choice.get("name"), str):
        raise InputError(f"tool_choice {choice!r} is not one this server takes; give 'auto', "
                         "'none', 'required' or {'type': 'function', 'name': ...}.")
    return {"type": "function", "function": {"name": choice["name"]}}


def response_format(text: TextConfig | None) -> dict[str, Any] | None:
    """``text.format`` as chat's ``response_format`` (a JSON schema's fields under
    ``json_schema``); None for plain text."""
    given = None if text is None else text.format
    if given is None or given.get("type") == "text":
        return None
    if given.get("type") == "json_schema":
        fields = {key: value for key, value in given.items() if key != "type"}
        return {"type": "json_schema", "json_schema": {"name": "response", **fields}}
    return given


def _answer_reader(stream: TextStream) -> Callable[..., str]:
    """``answer(piece, last=False)``: the part of a streamed piece that is the answer. A
    reasoning template's thinking is read apart and not sent (no reasoning items), so the
    deltas join to the whole response's output_text."""
    splitter = None if stream.held or stream.turn is None else stream.turn.splitter()

    def answer(piece: str, last: bool = False) -> str:
        if splitter is None:
            return piece
        said = splitter.add(piece)[1]
        return said + splitter.finish()[1] if last else said
    return answer


def _usage(counts: Usage) -> dict[str, Any]:
    return {"input_tokens": counts.prompt_tokens,
            "input_tokens_details": {"cached_tokens": counts.cached_tokens},
            "output_tokens": counts.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": counts.prompt_tokens + counts.completion_tokens}


class OutputText(BaseModel):
    """A message's ``output_text`` part, with its tokens' reports when asked for (chat's shape)."""

    type: Literal["output_text"]
    text: str
    annotations: list[Any]
    logprobs: list[ContentLogprob]


class OutputMessage(BaseModel):
    """The assistant's ``message`` output item."""

    type: Literal["message"]
    id: str
    status: Literal["in_progress", "completed", "incomplete"]
    role: Literal["assistant"]
    content: list[OutputText]


class OutputFunctionCall(BaseModel):
    """A ``function_call`` output item: the tool's name and its arguments as JSON text."""

    type: Literal["function_call"]
    id: str
    call_id: str
    name: str
    arguments: str
    status: Literal["completed"]


class InputTokensDetails(BaseModel):
    cached_tokens: int = Field(ge=0)


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = Field(ge=0)


class ResponseUsage(BaseModel):
    """A response's ``usage`` (:func:`_usage`)."""

    input_tokens: int = Field(ge=0)
    input_tokens_details: InputTokensDetails
    output_tokens: int = Field(ge=0)
    output_tokens_details: OutputTokensDetails
    total_tokens: int = Field(ge=0)


class ResponseObject(BaseModel):
    """The answer of ``POST /v1/responses`` and ``GET /v1/responses/{id}`` (a ``response``):
    its output items and, echoed, the options it was made with."""

    id: str
    object: Literal["response"]
    created_at: int
    status: Literal["in_progress", "completed", "incomplete"]
    error: None
    model: str
    output: list[OutputMessage | OutputFunctionCall]
    incomplete_details: dict[str, str] | None
    instructions: str | None
    max_output_tokens: int | None
    parallel_tool_calls: bool
    previous_response_id: str | None
    store: bool
    temperature: float
    top_p: float
    text: dict[str, Any]
    tool_choice: str | dict[str, Any]
    tools: list[dict[str, Any]]
    truncation: Literal["auto", "disabled"]
    metadata: dict[str, str]
    user: str | None
    reasoning: dict[str, Any]
    service_tier: str
    top_logprobs: int | None
    prompt_cache_key: str | None
    prompt_cache_retention: str | None
    safety_identifier: str | None
    usage: ResponseUsage | None


class DeletedResponse(BaseModel):
    """The answer of ``DELETE /v1/responses/{id}``."""

    id: str
    object: Literal["response"]
    deleted: Literal[True]


def _text_item(ident: str, text: str | None, status: str,
               logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    content = [] if text is None else [_text_part(text, logprobs)]
    return {"type": "message", "id": ident, "status": status, "role": "assistant",
            "content": content}


def _text_part(text: str, logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """An ``output_text`` part, with its tokens' reports when the request asked for them."""
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}


class _Reply:
    """One response being made: its id, its request and what its objects share."""

    def __init__(self, body: ResponsesRequest, model_name: str, defaults: dict[str, Any]) -> None:
        self.body, self.model_name = body, model_name
        #: The sampling in effect (the request's fields over the checkpoint's ``defaults``),
        #: reported as the response's temperature and top_p (0: greedy).
        self.sampling = sampling(body.temperature, body.top_p, None, defaults)
        self.ident = f"resp_{uuid.uuid4().hex}"
        self.created = int(time.time())
        #: Writes the reply tokens' reports (None: ``include`` did not ask for them).
        self.writer: TokenWriter | None = None

    def logprobs(self, reports: list[TokenLogprob]) -> list[dict[str, Any]]:
        """The reports of ``reports`` in the Responses shape ([] when none were asked for)."""
        return [] if self.writer is None else chat_content(self.writer, reports)

    def output(self, message: dict[str, Any], stream: TextStream, message_id: str | None = None,
               ) -> list[dict[str, Any]]:
        """The output items of the assistant's ``message``: its text, then its calls (only the
        first with ``parallel_tool_calls`` false)."""
        status = "incomplete" if stream.finish_reason(message) == "length" else "completed"
        calls = message.get("tool_calls") or []
        if self.body.parallel_tool_calls is False:
            calls = calls[:1]
        items = []
        if message.get("content") is not None or not calls:
            items.append(_text_item(message_id or f"msg_{uuid.uuid4().hex}",
                                    message.get("content") or "", status, self.logprobs(stream.logprobs)))
        items += [{"type": "function_call", "id": f"fc_{uuid.uuid4().hex}", "call_id": call["id"],
                   "name": call["function"]["name"], "arguments": call["function"]["arguments"],
                   "status": "completed"} for call in calls]
        return items

    def response(self, status: str, output: list[dict[str, Any]],
                 counts: Usage | None = None) -> dict[str, Any]:
        """The ``response`` object in ``status`` ("in_progress", "completed", "incomplete")."""
        body = self.body
        return {
            "id": self.ident, "object": "response", "created_at": self.created, "status": status,
            "error": None, "model": self.model_name, "output": output,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": body.instructions, "max_output_tokens": body.max_output_tokens,
            "parallel_tool_calls": body.parallel_tool_calls is not False,
            "previous_response_id": body.previous_response_id, "store": body.store is not False,
            "temperature": self.sampling.get("temperature", 0.0),
            "top_p": self.sampling.get("top_p", 1.0),
            "text": {"format": (body.text and body.text.format) or {"type": "text"},
                     "verbosity": (body.text and body.text.verbosity) or "medium"},
            "tool_choice": body.tool_choice or "auto", "tools": body.tools or [],
            "truncation": body.truncation or "disabled", "metadata": body.metadata or {},
            "user": body.user, "reasoning": options.reasoning_echo(body.reasoning),
            "service_tier": "default", "top_logprobs": body.top_logprobs,
            "prompt_cache_key": body.prompt_cache_key,
            "prompt_cache_retention": body.prompt_cache_retention,
            "safety_identifier": body.safety_identifier,
            "usage": None if counts is None else _usage(counts)}


class _EventWriter:
    """The server-sent events of one streamed response, numbered in order."""

    def __init__(self, obfuscate: bool = True) -> None:
        self.number, self.obfuscate = 0, obfuscate

    def event(self, kind: str, **fields: Any) -> str:
        data = {"type": kind, "sequence_number": self.number, **fields}
        if self.obfuscate and kind.endswith(".delta"):  # stream_options.include_obfuscation
            data["obfuscation"] = options.obfuscation()
        self.number += 1
        return f"event: {kind}\ndata: {json.dumps(data)}\n\n"

    def text_start(self, index: int, ident: str) -> str:
        """A message item opened, with its one (empty) text part."""
        return (self.event("response.output_item.added", output_index=index,
                           item=_text_item(ident, None, "in_progress"))
                + self.event("response.content_part.added", item_id=ident, output_index=index,
                             content_index=0, part=_text_part("")))

    def delta(self, index: int, ident: str, text: str,
              logprobs: list[dict[str, Any]] | None = None) -> str:
        return self.event("response.output_text.delta", item_id=ident, output_index=index,
                          content_index=0, delta=text, logprobs=logprobs or [])

    def item_done(self, index: int, item: dict[str, Any]) -> str:
        """The end of a message item (its text part done), or a whole function call item."""
        where = {"item_id": item["id"], "output_index": index}
        if item["type"] == "function_call":
            start = {**item, "arguments": "", "status": "in_progress"}
            return (self.event("response.output_item.added", output_index=index, item=start)
                    + self.event("response.function_call_arguments.delta", **where,
                                 delta=item["arguments"])
                    + self.event("response.function_call_arguments.done", **where,
                                 arguments=item["arguments"])
                    + self.event("response.output_item.done", output_index=index, item=item))
        text, logprobs = item["content"][0]["text"], item["content"][0]["logprobs"]
        return (self.event("response.output_text.done", **where, content_index=0, text=text,
                           logprobs=logprobs)
                + self.event("response.content_part.done", **where, content_index=0,
                             part=_text_part(text, logprobs))
                + self.event("response.output_item.done", output_index=index, item=item))


def _check_options(body: ResponsesRequest) -> None:
    """Refuse the option values this server cannot serve (:mod:`.response_options`)."""
    options.check_include(body.include)
    options.check_verbosity(None if body.text is None else body.text.verbosity)
    options.check_service_tier(body.service_tier)
    options.check_prompt_cache_retention(body.prompt_cache_retention)
    options.check_stream_options(body.stream_options, body.stream)


class StoredResponses:
    """``GET`` and ``DELETE /v1/responses/{response_id}`` over ``store`` (the openai client's
    ``responses.retrieve`` and ``responses.delete``): a stored response as it was answered, or
    404 with a sentence when the server does not hold it."""

    def __init__(self, store: ResponseStore, metrics: ServerMetrics) -> None:
        self.store, self.metrics = store, metrics

    async def retrieve(self, response_id: str) -> Any:
        try:
            return self.store.get(response_id, "response_id").response
        except UnknownResponse as exc:
            return self._missing(exc)

    async def delete(self, response_id: str) -> Any:
        try:
            self.store.delete(response_id)
        except UnknownResponse as exc:
            return self._missing(exc)
        return {"id": response_id, "object": "response", "deleted": True}

    def _missing(self, exc: UnknownResponse) -> Any:
        self.metrics.requests.labels("refused").inc()
        return error_response(404, str(exc), param="response_id")


class ResponsesServer:
    """``/v1/responses`` over ``service`` serving the model ``model_name`` (the metrics shared
    with the other endpoints), keeping responses in ``store``."""

    def __init__(self, served: Served) -> None:
        self.service, self.model_name = served.service, served.name
        self.metrics, self.store = served.metrics, served.store

    @endpoint
    async def create(self, body: ResponsesRequest, request: Request) -> Any:
        try:
            _check_options(body)
            history = ([] if body.previous_response_id is None
                       else self.store.conversation(body.previous_response_id))
            conversation = history + input_messages(body.input)
            system = [] if body.instructions is None else [{"role": "system",
                                                            "content": body.instructions}]
            tools, choice = chat_tools(body.tools), chat_tool_choice(body.tool_choice)
            # text.format shapes a text reply; a forced call (required, or a named function)
            # writes none, so the format waits for the turn that answers in text (as OpenAI's:
            # the Agents SDK sends both, tool_choice "required" and its output_type's schema)
            forced = choice not in (None, "auto", "none")
            fmt = None if forced else response_format(body.text)
            top = options.reported(body.include, body.top_logprobs)
            template_kwargs = options.reasoning_kwargs(
                body.reasoning, lambda: self.service.chat_template_text(tools))

            def start(kept: list[dict[str, Any]]) -> TextStream:
                return self.service.chat(
                    system + kept, max_tokens=body.max_output_tokens, temperature=body.temperature,
                    top_p=body.top_p, tools=tools, tool_choice=choice, response_format=fmt,
                    template_kwargs=template_kwargs, extra=RequestOptions(logprobs=top))

            # the template renders in a worker thread, off the event loop; a temperature or
            # top_p left out takes the checkpoint's sampling defaults (Service.chat)
            stream = await asyncio.to_thread(options.truncated, start, conversation, body.truncation)
        except UnknownResponse as exc:
            self.metrics.requests.labels("refused").inc()
            return error_response(404, str(exc), param="previous_response_id")
        reply = _Reply(body, self.model_name, self.service.generation_defaults)
        if top is not None:
            reply.writer = TokenWriter(self.service)
        if body.stream:
            return streamed(self._events(stream, reply, conversation), [stream], self.metrics)
        text = await settled(request, [stream], self.metrics, stream.text())
        return self._done(stream, reply, conversation, stream.message(text))

    def _done(self, stream: TextStream, reply: _Reply, conversation: list[dict[str, Any]],
              message: dict[str, Any], message_id: str | None = None) -> dict[str, Any]:
        """The finished response, stored (with ``store`` not false) to be continued and read
        again."""
        output = reply.output(message, stream, message_id)
        status = "incomplete" if stream.finish_reason(message) == "length" else "completed"
        done = reply.response(status, output, stream.usage)
        if reply.body.store is not False:
            said = {key: value for key, value in message.items() if value is not None}
            calls = [item for item in output if item["type"] == "function_call"]
            if calls:  # the calls as sent (parallel_tool_calls may have kept the first only)
                said["tool_calls"] = said["tool_calls"][:len(calls)]
            self.store.put(reply.ident, done, [*conversation, {**said, "role": "assistant"}])
        return done

    async def _events(self, stream: TextStream, reply: _Reply,
                      conversation: list[dict[str, Any]]) -> AsyncIterator[str]:
        """The Responses events of one reply; a request that failed ends with an error event
        (the openai client raises ``APIError``)."""
        given = reply.body.stream_options
        write = _EventWriter(given is None or given.include_obfuscation)
        yield write.event("response.created", response=reply.response("in_progress", []))
        yield write.event("response.in_progress", response=reply.response("in_progress", []))
        message_id, texts = f"msg_{uuid.uuid4().hex}", []
        answer = _answer_reader(stream)
        if not stream.held:
            yield write.text_start(0, message_id)
        pending: list[TokenLogprob] = []  # reports of tokens whose text is held back
        async for deltas in stream.arrivals():  # several tokens' text in one event
            pending.extend(d.logprob for d in deltas if d.logprob is not None)
            piece = "".join(d.text for d in deltas)
            texts.append(piece)
            if piece and not stream.held and (said := answer(piece)):
                yield write.delta(0, message_id, said, reply.logprobs(pending))
                pending = []
        if (failed := failure_event(stream.failure)) is not None:
            yield failed
            return
        rest = stream.rest()
        if not stream.held and (said := answer(rest, last=True)):
            yield write.delta(0, message_id, said, reply.logprobs(pending))
        message = stream.message("".join(texts) + rest)
        done = self._done(stream, reply, conversation, message, message_id)
        for index, item in enumerate(done["output"]):
            if stream.held and item["type"] == "message":
                yield write.text_start(index, item["id"])
                if item["content"][0]["text"]:
                    yield write.delta(index, item["id"], item["content"][0]["text"],
                                      item["content"][0]["logprobs"])
            yield write.item_done(index, item)
        yield write.event(f"response.{done['status']}", response=done)


ROUTES = Family(ResponsesServer, ResponsesServer.create, ("/v1/responses",), ResponsesRequest,
                ResponseObject, streams=True)
