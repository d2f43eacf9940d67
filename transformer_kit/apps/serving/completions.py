"""``POST /v1/completions`` in OpenAI's convention over the runtime's
:meth:`~transformer_kit.runtime.Service.complete`: a prompt (text, token ids, or a list of
either: a choice per prompt, each with its ``index``), continued by the engine.

With ``logprobs`` (0-5) each choice carries the legacy ``logprobs`` object (``tokens``,
``token_logprobs``, ``top_logprobs``, ``text_offset``); with ``echo`` the prompt comes first,
its text and, with ``logprobs``, its tokens' reports (the first ``null``), and ``max_tokens: 0``
answers the prompt alone: what lm-evaluation-harness's ``local-completions`` scores
multiple-choice tasks with. vLLM's ``prompt_logprobs`` adds the prompt's reports in vLLM's
shape. Each choice also carries ``token_ids``, the ids behind its text (a streamed chunk: the
ids of that chunk).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any, Literal

from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field

from transformer_kit.apps.serving.choices import arrivals, total_usage
from transformer_kit.apps.serving.logprobs import (
    TokenWriter,
    completion_logprobs,
    joined,
    prompt_report,
)
from transformer_kit.apps.serving.openai_api import UsageBody, failure_event, usage
from transformer_kit.apps.serving.routes import Family, Served, endpoint, settled, streamed
from transformer_kit.apps.serving.sampling_fields import (
    MAX_CHOICES,
    SamplingFields,
    StreamOptions,
    request_options,
    stream_usage,
)
from transformer_kit.core.errors import InputError
from transformer_kit.runtime.text_stream import Delta, TextStream, Usage

#: Most prompts one request may list (each is a request of the engine's).
MAX_PROMPTS = 256


#: ``max_tokens`` of a completion that leaves it out (or sends null): OpenAI's 16.
COMPLETION_MAX_TOKENS = 16


class CompletionRequest(SamplingFields):
    """The body of ``POST /v1/completions``: OpenAI's fields this server honours and vLLM's
    sampling extras (:class:`.SamplingFields`); any other field is refused (400), so a client
    never believes an option took effect when it did not. Null is a field's default."""

    model_config = ConfigDict(extra="forbid")

    model: str
    prompt: str | list[int] | list[str] | list[list[int]]
    #: Choices decoded per prompt, of which the ``n`` with the highest log probability per token
    #: are answered (OpenAI's; None: ``n``). Not streamed: the best are known once all end.
    best_of: int | None = Field(None, ge=1, le=MAX_CHOICES)
    #: 0: no new token (with ``echo``, the prompt alone).
    max_tokens: int | None = Field(COMPLETION_MAX_TOKENS, ge=0)
    #: None: the checkpoint's default (its generation_config.json), else OpenAI's 1.
    temperature: float | None = Field(None, ge=0.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    #: Each token's log probability and this many of the most likely (OpenAI's bound, 5).
    logprobs: int | None = Field(None, ge=0, le=5)
    #: The prompt before the reply, in the text and (with ``logprobs``) in the reports.
    echo: bool | None = False
    #: vLLM's: each prompt token's log probability and this many of the most likely.
    prompt_logprobs: int | None = Field(None, ge=0, le=20)
    #: What the reports are of: "raw" (the model's logits, the default) or "processed" (the
    #: scores the token was chosen from; vLLM's server-wide ``--logprobs-mode``, per request).
    logprobs_mode: Literal["raw", "processed"] | None = None
    #: An extension (as vLLM's extra parameters; the openai client sends it in ``extra_body``):
    #: speculative decoding with prompt lookup while the request decodes alone.
    prompt_lookup_num_tokens: int | None = Field(None, ge=1, le=64)


class LegacyLogprobs(BaseModel):
    """A choice's ``logprobs`` (OpenAI's legacy completions shape): per token its text, log
    probability (None: a prompt's first), the most likely tokens and its offset in the text."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class PromptTokenLogprob(BaseModel):
    """One token of vLLM's ``prompt_logprobs`` at a position."""

    logprob: float
    rank: int = Field(ge=1)
    decoded_token: str


class CompletionChoice(BaseModel):
    """One prompt's answer (a streamed chunk: its piece, ``finish_reason`` on the last)."""

    index: int = Field(ge=0)
    text: str
    token_ids: list[int]
    logprobs: LegacyLogprobs | None
    finish_reason: Literal["stop", "length"] | None
    prompt_logprobs: list[dict[str, PromptTokenLogprob] | None] | None = None
    prompt_token_ids: list[int] | None = None


class Completion(BaseModel):
    """The answer of ``POST /v1/completions`` (a ``text_completion``)."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageBody


def prompts_of(prompt: Any) -> list[str | list[int]]:
    """The request's prompts: text, ids, or a list of texts or of id lists (InputError for an
    empty one or more than :data:`MAX_PROMPTS`)."""
    if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
        return [prompt]
    if not prompt:
        raise InputError("prompt is an empty list; give text, token ids, or a list of either.")
    if len(prompt) > MAX_PROMPTS:
        raise InputError(f"prompt lists {len(prompt)} prompts; this server takes at most "
                         f"{MAX_PROMPTS} per request. Split them over several requests.")
    empty = [i for i, p in enumerate(prompt) if not p]
    if empty:
        raise InputError(f"prompt[{empty[0]}] is empty; every prompt needs some text or ids.")
    return list(prompt)


def best_of(body: CompletionRequest) -> int:
    """The choices decoded per prompt: ``best_of``, or ``n`` without it (InputError for fewer
    than ``n``, or more with ``stream``)."""
    n = body.n or 1
    best = n if body.best_of is None else body.best_of
    if best < n:
        raise InputError(f"best_of ({best}) is less than n ({n}): the n answered choices are the "
                         "best of best_of. Give best_of of at least n, or leave it out.")
    if best > n and body.stream:
        raise InputError(f"best_of ({best}) above n ({n}) cannot stream: the best choices are known "
                         "only once every one has ended (as OpenAI's). Leave stream out, or best_of.")
    return best


def _per_token(stream: TextStream) -> float:
    """A choice's log probability per token (0 for a choice of no token): what best_of ranks by."""
    reports = stream.logprobs
    return sum(r.logprob for r in reports) / len(reports) if reports else 0.0


def _prompt_top(body: CompletionRequest) -> int | None:
    """How many alternatives the prompt's reports list: echo's (``logprobs``) or vLLM's
    ``prompt_logprobs``, the more of the two (None: no report)."""
    wanted = [body.prompt_logprobs, body.logprobs if body.echo else None]
    given = [k for k in wanted if k is not None]
    return max(given) if given else None


class _Choice:
    """One prompt's choice: its stream and what it writes before and around the reply's text."""

    def __init__(self, index: int, prompt: str | list[int], stream: TextStream,
                 body: CompletionRequest, writer: TokenWriter) -> None:
        self.index, self.stream, self.body, self.writer = index, stream, body, writer
        self.echoed = writer.service.prompt_text(prompt) if body.echo else ""

    def prompt_reports(self) -> dict[str, Any] | None:
        """The echoed prompt's legacy reports (None: not asked for)."""
        if not self.body.echo or self.body.logprobs is None:
            return None
        stream = self.stream
        return completion_logprobs(self.writer, stream.prompt_ids, stream.prompt_logprobs or [])

    def reports(self, ids: list[int], reports: list, offset: int) -> dict[str, Any] | None:
        if self.body.logprobs is None:
            return None
        return completion_logprobs(self.writer, ids, reports, offset)

    def extras(self) -> dict[str, Any]:
        """vLLM's ``prompt_logprobs`` and ``prompt_token_ids``, when asked for."""
        if self.body.prompt_logprobs is None:
            return {}
        stream = self.stream
        return {"prompt_logprobs": prompt_report(self.writer, stream.prompt_logprobs or []),
                "prompt_token_ids": stream.prompt_ids}

    def whole(self, text: str) -> dict[str, Any]:
        stream = self.stream
        reports = self.reports(stream.token_ids, stream.logprobs, len(self.echoed))
        if reports is not None:
            reports = joined(self.prompt_reports(), reports)
        return {"index": self.index, "text": self.echoed + text, "token_ids": stream.token_ids,
                "logprobs": reports, "finish_reason": stream.finish_reason(), **self.extras()}


class CompletionServer:
    """``/v1/completions`` over ``service`` serving the model ``model_name`` (the metrics
    shared with the other endpoints)."""

    def __init__(self, served: Served) -> None:
        self.service, self.model_name, self.metrics = served.service, served.name, served.metrics

    def _submit(self, body: CompletionRequest, best: int) -> list[_Choice]:
        """Every prompt's ``best`` requests (choice ``prompt x best + j``), or none (a refusal
        cancels those already submitted). Decoding more than ``n`` reports each token's log
        probability, which ranks them (a choice's reports are answered only when asked for)."""
        prompts, choices = prompts_of(body.prompt), []
        writer = TokenWriter(self.service)
        reported = body.logprobs if body.logprobs is not None or best == (body.n or 1) else 0
        extra = replace(request_options(body), logprobs=reported, logprobs_mode=body.logprobs_mode,
                        prompt_logprobs=_prompt_top(body))
        try:
            for prompt in prompts:
                most = COMPLETION_MAX_TOKENS if body.max_tokens is None else body.max_tokens
                streams = self.service.complete_choices(
                    prompt, best, max_tokens=most, temperature=body.temperature, top_p=body.top_p,
                    seed=body.seed, stop=body.stop,
                    prompt_lookup_num_tokens=body.prompt_lookup_num_tokens, extra=extra)
                first = len(choices)
                choices += [_Choice(first + j, prompt, each, body, writer) for j, each in enumerate(streams)]
        except BaseException:
            for choice in choices:
                choice.stream.cancel()
            raise
        return choices

    @endpoint
    async def completions(self, body: CompletionRequest, request: Request) -> Any:
        metrics = self.metrics
        counts = stream_usage(body.stream_options, bool(body.stream))
        best, n = best_of(body), body.n or 1
        choices = self._submit(body, best)
        head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion",
                "created": int(time.time()), "model": self.model_name}
        streams = [c.stream for c in choices]
        if body.stream:
            return streamed(_events(choices, head, counts), streams, metrics)
        replies = await settled(request, streams, metrics,
                                asyncio.gather(*(stream.text() for stream in streams)))
        answered = [c.whole(text) for c, text in _best(choices, replies, n, best)]
        return {**head, "choices": answered, "usage": usage(_total(choices, best))}


def _best(choices: list[_Choice], replies: list[str], n: int, best: int) -> list[tuple[_Choice, str]]:
    """Of each prompt's ``best`` choices, the ``n`` with the highest log probability per token
    (ties: the earlier), numbered ``prompt x n + j`` (all of them, in order, when ``best`` is
    ``n``)."""
    kept = []
    for first in range(0, len(choices), best):
        group = list(zip(choices[first:first + best], replies[first:first + best], strict=True))
        if best > n:
            group = sorted(group, key=lambda pair: -_per_token(pair[0].stream))[:n]
        for j, (choice, reply) in enumerate(group):
            choice.index = first // best * n + j
            kept.append((choice, reply))
    return kept


def _total(choices: list[_Choice], n: int) -> Usage:
    """The usage of every choice decoded: each prompt's tokens once (its ``n`` choices share it,
    as OpenAI and vLLM count them), every choice's new tokens (best_of's unanswered ones too, as
    OpenAI counts them)."""
    groups = [choices[i:i + n] for i in range(0, len(choices), n)]
    each = [total_usage([c.stream for c in group]) for group in groups]
    return Usage(sum(u.prompt_tokens for u in each), sum(u.completion_tokens for u in each),
                 sum(u.cached_tokens for u in each))


class _Chunks:
    """The events of a completion's choices: with ``include_usage`` each carries ``usage``
    (null, or with ``continuous_usage_stats`` its choice's counts so far)."""

    def __init__(self, choices: list[_Choice], fields: dict[str, Any], counts: tuple[bool, bool]) -> None:
        self.choices, self.head = choices, json.dumps(fields)[:-1]
        self.include_usage, self.continuous = counts
        self.sent = [0] * len(choices)  # each choice's tokens sent so far
        self.offsets = [len(c.echoed) for c in choices]  # each choice's text so far (text_offset)

    def event(self, listed: list[dict], counted: dict | None = None) -> str:
        tail = f', "usage": {json.dumps(counted)}' if self.include_usage else ""
        return f'data: {self.head}, "choices": {json.dumps(listed)}{tail}}}\n\n'

    def chunk(self, index: int, text: str, ids: list[int], reports: dict | None,
              reason: str | None = None, extras: dict | None = None) -> str:
        self.sent[index] += len(ids)
        stream = self.choices[index].stream
        counted = usage(Usage(stream.prompt_tokens, self.sent[index], stream.usage.cached_tokens)
                        ) if self.continuous else None
        return self.event([{"index": index, "text": text, "token_ids": ids, "logprobs": reports,
                            "finish_reason": reason, **(extras or {})}], counted)

    async def echoes(self) -> AsyncIterator[str]:
        """Each choice's echoed prompt and its reports, once its prefill gave them."""
        for i, choice in enumerate(self.choices):
            if choice.echoed or choice.body.prompt_logprobs is not None:
                if choice.stream.request.prompt_top is not None:
                    await choice.stream.request.prefilled()
                yield self.chunk(i, choice.echoed, [], choice.prompt_reports(), extras=choice.extras())

    def tokens(self, index: int, deltas: list[Delta]) -> str:
        """The chunks of choice ``index``'s newly arrived tokens, in one write."""
        choice, parts = self.choices[index], []
        for d in deltas:
            parts.append(self.chunk(index, d.text, [d.token_id],
                                    choice.reports([d.token_id], [d.logprob], self.offsets[index])))
            if choice.body.logprobs is not None:
                self.offsets[index] += len(choice.writer.text(d.token_id))
        return "".join(parts)

    def ended(self, index: int) -> str:
        stream = self.choices[index].stream
        return failure_event(stream.failure) or self.chunk(index, stream.rest(), [], None,
                                                           stream.finish_reason())


async def _events(choices: list[_Choice], fields: dict[str, Any],
                  counts: tuple[bool, bool] = (False, False)) -> AsyncIterator[str]:
    """Server-sent events: each choice's echoed prompt (if any), a chunk per token of each
    choice (its ``index``; several prompts' and ``n``'s interleaved as their tokens come), the
    last of a choice with its finish reason, the usage chunk with ``include_usage``, then
    [DONE]; with ``continuous_usage_stats`` every chunk also carries its choice's counts so far.
    A request that failed (its time ran out, decoding failed) ends with an error event instead
    of the last chunk."""
    write = _Chunks(choices, fields, counts)
    async for echoed in write.echoes():
        yield echoed
    streams = [c.stream for c in choices]
    async with contextlib.aclosing(arrivals(streams)) as arrived:
        async for index, deltas in arrived:  # several tokens' events in one write
            if deltas is not None:
                yield write.tokens(index, deltas)
                continue
            yield write.ended(index)
            if streams[index].failure is not None:
                break
        else:
            if write.include_usage:
                yield write.event([], usage(_total(choices, choices[0].body.n or 1)))
    yield "data: [DONE]\n\n"


ROUTES = Family(CompletionServer, CompletionServer.completions, ("/v1/completions",),
                CompletionRequest, Completion, streams=True)
