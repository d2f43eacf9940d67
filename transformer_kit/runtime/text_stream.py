"""A generation request read as text: its tokens turned into text deltas as they arrive, stop
strings cut, and for a chat the reply read back as the assistant's message (text, tool calls)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

from transformer_kit.core.decoding.logprobs import TokenLogprob
from transformer_kit.core.decoding.text import TextPieces
from transformer_kit.runtime.requests import Failure, GenerationRequest


@dataclass(frozen=True)
class Delta:
    """One new token and the text it adds ('' while a character is incomplete or the text may
    be a stop string's start; the held-back text comes with a later delta or the rest)."""

    text: str
    token_id: int
    #: The token's log probability report, when the request asked for them (else None).
    logprob: TokenLogprob | None = None


@dataclass(frozen=True)
class Usage:
    """A reply's token counts; ``cached_tokens``: prompt tokens whose cache came from the
    engine's prefix cache."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


class TextStream:
    """A submitted generation request's text.

    Iterate it (blocking) or ``async for`` over :meth:`arrivals` for the deltas as tokens are
    chosen, then take :meth:`rest` (the text held back to the end). Without a tokenizer (token
    ids in) every delta's text is ''. ``turn``: the chat turn the prompt was rendered from
    (None for a completion); a chat whose model may call tools is read at the end
    (``held``): its :meth:`message` is the reply as content or tool calls.
    """

    def __init__(self, request: GenerationRequest, pieces: TextPieces | None, prompt_tokens: int,
                 turn: Any = None) -> None:
        self.request, self.pieces, self.turn = request, pieces, turn
        self.prompt_tokens = prompt_tokens
        self._read = 0  # tokens turned into deltas so far

    @property
    def held(self) -> bool:
        """Whether the reply may hold tool calls, so its text is read whole at the end."""
        return self.turn is not None and bool(self.turn.names)

    def _deltas(self, tokens: list[int]) -> list[Delta]:
        pieces, reports = self.pieces, self.request.logprobs
        first, self._read = self._read, self._read + len(tokens)
        return [Delta(pieces.add(t) if pieces is not None else "", t,
                      reports[first + i] if reports else None) for i, t in enumerate(tokens)]

    async def arrivals(self) -> AsyncIterator[list[Delta]]:
        """The deltas of the tokens that came since the last look (one while the reader keeps
        up); no thread held while waiting."""
        async for tokens in self.request.arrivals():
            yield self._deltas(tokens)

    def __iter__(self) -> Iterator[Delta]:
        for token in self.request:
            yield from self._deltas([token])

    def rest(self) -> str:
        """The text left at the end (held back for a stop string, an incomplete character)."""
        return "" if self.pieces is None else self.pieces.finish()

    async def text(self) -> str:
        """The whole reply's text, after waiting for the end (no thread held)."""
        texts = [d.text async for arrived in self.arrivals() for d in arrived]
        return "".join(texts) + self.rest()

    def message(self, text: str) -> dict[str, Any]:
        """A chat's reply as the assistant's message: ``content`` and ``tool_calls`` (a
        completion: its text as content)."""
        return {"content": text} if self.turn is None else self.turn.message(text)

    def finish_reason(self, message: dict[str, Any] | None = None) -> str:
        """OpenAI's finish reason: "tool_calls" for a message calling tools, "length" when
        max_tokens ended it, else "stop"."""
        if message is not None and message.get("tool_calls"):
            return "tool_calls"
        return "length" if self.request.finish_reason == "length" else "stop"

    @property
    def failure(self) -> Failure | None:
        return self.request.failure

    @property
    def usage(self) -> Usage:
        return Usage(self.prompt_tokens, len(self.request.tokens), self.request.cached_tokens)

    @property
    def token_ids(self) -> list[int]:
        return list(self.request.tokens)

    @property
    def logprobs(self) -> list[TokenLogprob]:
        """The new tokens' log probability reports so far ([]: none asked for)."""
        return list(self.request.logprobs)

    @property
    def prompt_logprobs(self) -> list[TokenLogprob | None] | None:
        """The prompt tokens' reports (the first None), when the request asked for them."""
        return self.request.prompt_logprobs

    @property
    def prompt_ids(self) -> list[int]:
        return self.request.prompt.tolist()

    def cancel(self) -> None:
        """Stop decoding (no-op once ended): its row leaves the batch at the next step."""
        self.request.cancel()
