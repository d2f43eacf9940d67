"""What ``POST /v1/responses`` does with the request's options beyond the conversation, in one
place: each ``include`` value OpenAI defines, served or refused by name with the reason; log
probabilities (:func:`reported`);
``reasoning`` (its effort is the chat template's ``reasoning_effort``), ``truncation``
("auto" drops the oldest items until the conversation fits), the prompt cache's hints
(``prompt_cache_key``, ``prompt_cache_retention``), ``service_tier`` and ``stream_options``
(``include_obfuscation``), ``text.verbosity``; the fields OpenAI defines that are not served
(:data:`NOT_SERVED`). Each refusal is an :class:`~transformer_kit.core.errors.InputError`
(400) saying what was given, why it would not take effect here, and what to send instead.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from transformer_kit.core.errors import ContextLengthError, InputError
from transformer_kit.runtime.service import REASONING_EFFORTS

#: The fields OpenAI defines that this server does not serve, each with the reason (refused by
#: name, 400, where any other unknown field gets the list of the fields it takes).
NOT_SERVED = {
    "background": "this server answers a response while the request waits for it (or streams "
                  "it) and keeps no background jobs; send it without background, streamed to see "
                  "the reply as it comes",
    "conversation": "this server keeps no conversation objects; continue a stored response with "
                    "previous_response_id (the Agents SDK's auto_previous_response_id) or send the "
                    "whole conversation as input",
    "prompt": "this server holds no stored prompts; send the prompt's text as instructions and "
              "input",
    "context_management": "this server does not compact a conversation; leave it out, or set "
                          "truncation 'auto' to drop the oldest items of a conversation that "
                          "outgrows the context",
    "prompt_cache_options": "this server's prefix cache takes no breakpoints or lifetimes (it "
                            "reuses the longest cached prefix of any prompt); leave it out",
    "max_tool_calls": "it bounds the calls to built-in tools, and this server has none (it calls "
                      "function tools only, each call answered by the client); leave it out",
    "moderation": "this server runs no moderation model; leave moderation out",
}

#: The ``include`` value asking for the reply tokens' log probabilities (with ``top_logprobs``
#: of the most likely each): each ``output_text`` part and text delta carries its ``logprobs``.
LOGPROBS_INCLUDE = "message.output_text.logprobs"

#: The other ``include`` values OpenAI defines, each with the reason this server refuses it:
#: none of them has anything to include in a response made here.
INCLUDE_REFUSALS = {
    "file_search_call.results": "this server calls function tools only, so a response holds no "
                                "file_search call whose results could be included",
    "web_search_call.results": "this server calls function tools only, so a response holds no "
                               "web_search call whose results could be included",
    "web_search_call.action.sources": "this server calls function tools only, so a response holds "
                                      "no web_search call whose sources could be included",
    "message.input_image.image_url": "this server takes text input only, so a message holds no "
                                     "input image whose URL could be included",
    "computer_call_output.output.image_url": "this server calls function tools only, so a "
                                             "response holds no computer call output",
    "code_interpreter_call.outputs": "this server calls function tools only, so a response holds "
                                     "no code_interpreter call whose outputs could be included",
    "reasoning.encrypted_content": "this server returns no reasoning items (a reasoning model's "
                                   "thinking is read apart from its answer and not sent), so there "
                                   "is no reasoning to carry encrypted; continue a conversation "
                                   "with previous_response_id or send it back as input",
}


def check_include(include: list[str] | None) -> None:
    """Refuse each ``include`` value this server does not serve, by name, with the reason (an
    empty list, or none, includes nothing more)."""
    known = [LOGPROBS_INCLUDE, *INCLUDE_REFUSALS]
    for i, value in enumerate(include or ()):
        if value == LOGPROBS_INCLUDE:
            continue
        if value in INCLUDE_REFUSALS:
            raise InputError(f"include[{i}] is {value!r}, which is not served: "
                             f"{INCLUDE_REFUSALS[value]}; leave it out of include.")
        else:
            raise InputError(f"include[{i}] is {value!r}, which is none of the values OpenAI "
                             f"defines ({', '.join(map(repr, known))}); give one of them or "
                             "leave include out.")


def reported(include: list[str] | None, top_logprobs: int | None) -> int | None:
    """How many of the most likely tokens each reply token's report lists (None: no reports,
    ``include`` does not ask for them). ``top_logprobs`` without that ``include`` value would
    not take effect: refused."""
    if LOGPROBS_INCLUDE in (include or ()):
        return top_logprobs or 0
    if top_logprobs is not None:
        raise InputError(f"top_logprobs is {top_logprobs}, but include does not ask for log "
                         f"probabilities, so none would be returned; add {LOGPROBS_INCLUDE!r} to "
                         "include, or leave top_logprobs out.")
    return None


class ReasoningConfig(BaseModel):
    """``reasoning``: ``effort`` becomes the chat template's ``reasoning_effort`` (gpt-oss's
    harmony template reads it; refused for a template that does not); a ``summary`` is refused,
    as no reasoning items are returned."""

    model_config = ConfigDict(extra="forbid")

    effort: str | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    #: OpenAI's older name of ``summary``.
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


def reasoning_kwargs(reasoning: ReasoningConfig | None,
                     template: Callable[[], str]) -> dict[str, Any] | None:
    """The chat template variables of ``reasoning`` (None: none), ``template()`` giving the chat
    template the turn renders with. InputError for a summary, an effort for a template that
    never reads ``reasoning_effort``, or one it does not take."""
    if reasoning is None:
        return None
    summary = reasoning.summary or reasoning.generate_summary
    if summary is not None:
        raise InputError(f"reasoning.summary is {summary!r}, which is not served: this server returns "
                         "no reasoning items (a reasoning model's thinking is read apart from its "
                         "answer and not sent), so there is nothing to summarise; leave "
                         "reasoning.summary out.")
    effort = reasoning.effort
    if effort is None:
        return None
    if not re.search(r"\breasoning_effort\b", template()):
        raise InputError(f"reasoning.effort is {effort!r}, but this model's chat template has no "
                         "reasoning_effort switch (it never reads it), so the effort would not take "
                         "effect; leave reasoning.effort out for this model.")
    allowed = REASONING_EFFORTS
    if effort not in allowed:
        raise InputError(f"reasoning.effort is {effort!r}; this model's chat template takes "
                         f"{', '.join(map(repr, allowed))}: give one of them.")
    return {"reasoning_effort": effort}


def reasoning_echo(reasoning: ReasoningConfig | None) -> dict[str, Any]:
    """The response's ``reasoning``: the effort given (None: the template's own) and no summary."""
    return {"effort": None if reasoning is None else reasoning.effort, "summary": None}


def check_verbosity(verbosity: str | None) -> None:
    """Refuse a verbosity other than the model's own ("medium", OpenAI's default)."""
    if verbosity is not None and verbosity != "medium":
        raise InputError(f"text.verbosity is {verbosity!r}; this server cannot make a model's "
                         "answers shorter or longer than it writes them (OpenAI's 'medium'): give "
                         "'medium' or leave it out.")


#: The one service tier this server has (a request is answered as it comes, batched with others).
SERVICE_TIERS = ("auto", "default")


def check_service_tier(tier: str | None) -> None:
    """Refuse a tier other than the one this server has."""
    if tier is not None and tier not in SERVICE_TIERS:
        raise InputError(f"service_tier is {tier!r}; this server has one tier, which answers each "
                         "request as it comes, batched with the others ('default'): give 'auto' or "
                         "'default', or leave service_tier out.")


def check_prompt_cache_retention(retention: str | None) -> None:
    """Refuse a retention the prefix cache does not promise (it holds prompts in memory, the
    least recently used evicted first when it is full)."""
    if retention is not None and retention != "in_memory":
        raise InputError(f"prompt_cache_retention is {retention!r}; this server's prefix cache keeps "
                         "prompts in memory only, the least recently used evicted first when it is "
                         "full, with no promise of 24 hours: give 'in_memory' or leave it out.")


class StreamOptions(BaseModel):
    """``stream_options`` of a streamed response: ``include_obfuscation`` (OpenAI's default:
    true) pads each delta event with an ``obfuscation`` field of random characters, so the
    events' sizes do not give away the tokens' lengths."""

    model_config = ConfigDict(extra="forbid")

    include_obfuscation: bool = True


def check_stream_options(options: StreamOptions | None, stream: bool) -> None:
    """Refuse ``stream_options`` on a response that is not streamed (OpenAI's rule)."""
    if options is not None and not stream:
        raise InputError("stream_options is only allowed with stream=true; set stream or leave "
                         "stream_options out.")


def obfuscation() -> str:
    """Random characters of a random length (1 to 32), for a delta event's ``obfuscation``."""
    return secrets.token_urlsafe(24)[:1 + secrets.randbelow(32)]


def truncated(start: Callable[[list[dict[str, Any]]], Any], conversation: list[dict[str, Any]],
              truncation: str | None) -> Any:
    """``start(conversation)``, and with ``truncation`` "auto", when the conversation does not
    fit the context (a ContextLengthError), ``start`` of it without its oldest items, one at a
    time, until it fits (a tool output whose call was dropped goes with it; the last item is
    kept, and a conversation whose last item alone does not fit is refused as before)."""
    kept = conversation
    while True:
        try:
            return start(kept)
        except ContextLengthError:
            if truncation != "auto" or len(kept) <= 1:
                raise
            kept = kept[1:]
            while len(kept) > 1 and kept[0].get("role") == "tool":
                kept = kept[1:]
