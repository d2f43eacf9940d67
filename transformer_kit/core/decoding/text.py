"""Decoding's text side, for any runtime: the rows' text read back from their tokens (up to an
end id, cut before a stop string), streamed pieces that never split a character, and the chat
reply of a runtime that has a tokenizer. A tokenizer is reached through :class:`Tokenizer`
(the checkpoint's :class:`transformer_kit.tokenizer.TextTokenizer` is one).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

import numpy as np

from transformer_kit.core.errors import InputError

_BROKEN = "\ufffd"  # what decoding shows for an incomplete UTF-8 sequence


class ChatTurnLike(Protocol):
    """One prepared assistant turn (what :meth:`Tokenizer.chat_turn` gives)."""

    prompt: str
    options: dict[str, Any]

    def message(self, text: str) -> dict[str, Any]:
        """The assistant's message for the generated ``text``."""

    def splitter(self) -> Any:
        """A reader of the reply's pieces into (reasoning, content), or None."""


class Tokenizer(Protocol):
    """Text in, text out: what the core asks of a model's tokenizer."""

    backend: Any  # the ``tokenizers.Tokenizer``

    def encode(self, texts: list[str], add_special_tokens: bool = True
               ) -> tuple[np.ndarray, np.ndarray]:
        """Prompts -> ids (batch, longest) int64, right-padded, and (batch, longest) bool, True
        for real tokens."""

    def decode(self, tokens: Iterable[int], skip_special_tokens: bool = True) -> str:
        """Text of ``tokens`` with special tokens skipped (False: written out)."""

    def stop_matcher(self, stops: list[str], skip_special_tokens: bool = True
                     ) -> Callable[[np.ndarray], np.ndarray]:
        """new tokens (rows, n) -> (rows,) True where a stop string just completed, in the text
        decoded as ``decode`` decodes it."""

    def save(self, folder: Any) -> list[str]:
        """Write the tokenizer's files into ``folder``; their names."""

    def chat_turn(self, messages: list[dict], *, tools: list[dict] | None = None,
                  tool_choice: Any = None, chat_template: str | None = None,
                  template_kwargs: dict | None = None, options: dict[str, Any]) -> ChatTurnLike:
        """One assistant turn of ``messages``, rendered by the tokenizer's chat template."""


class Reply(str):
    """A row's generated text (a ``str``) that also says why it ended: ``finish_reason``
    ``"stop"`` (an end id or a stop string) or ``"length"`` (``max_new_tokens`` or the
    model's context ran out first: the text was cut), as OpenAI's field."""

    finish_reason: str
    #: With the option ``logprobs``: the reports of the row's new tokens (end token included).
    logprobs: list | None

    def __new__(cls, text: str, finish_reason: str, logprobs: list | None = None) -> Reply:
        reply = super().__new__(cls, text)
        reply.finish_reason, reply.logprobs = finish_reason, logprobs
        return reply


def row_texts(tokenizer: Tokenizer, tokens: np.ndarray, eos_ids: list[int],
              stops: list[str], logprobs: list[list] | None = None) -> list[Reply]:
    """Each row's text: tokens up to its first eos id, decoded, cut before a stop string; a
    row with neither was cut (finish_reason "length"). ``logprobs``: each row's reports, kept
    on its reply."""
    texts = []
    for i, row in enumerate(np.asarray(tokens)):
        ends = np.flatnonzero(np.isin(row, eos_ids))
        whole = tokenizer.decode(row[:ends[0]] if len(ends) else row)
        text = cut_at_stop(whole, stops)
        texts.append(Reply(text, "stop" if len(ends) or text != whole else "length",
                           None if logprobs is None else logprobs[i]))
    return texts


def first_stop(text: str, stops: list[str], after: int = 0) -> tuple[int, str] | None:
    """Where the first stop string in ``text`` ending past its first ``after`` characters
    starts, and which it is (at one start, the shortest: it completed first); None: none."""
    found = [(i, s) for s in stops if (i := text.find(s, max(after - len(s) + 1, 0))) >= 0]
    return min(found, key=lambda f: (f[0], len(f[1]))) if found else None


def cut_at_stop(text: str, stops: list[str], keep: bool = False) -> str:
    """``text`` up to the first stop string (excluded, as OpenAI's API returns it; ``keep``:
    included, as vLLM's ``include_stop_str_in_output``)."""
    found = first_stop(text, stops)
    if found is None:
        return text
    return text[:found[0] + len(found[1])] if keep else text[:found[0]]


class TextPieces:
    """One row's streamed text: ``add(token)`` returns the new piece of text ('' while a
    character is incomplete, after the row ended, or while the text may be a stop string's
    start); ``finish()`` returns what is left. The pieces join to :func:`row_texts`' text.

    ``min_tokens``: a stop string counts only where it ends in the text of that token or later
    (the row cannot end before it: ``min_new_tokens``); ``keep_stop``: the text keeps the stop
    string, or the end id's text, it ended at; ``skip_special_tokens`` False: special tokens
    are written out.
    """

    def __init__(self, tokenizer: Tokenizer, eos_ids: list[int], stops: list[str], *,
                 min_tokens: int = 0, keep_stop: bool = False, skip_special_tokens: bool = True) -> None:
        self.tokenizer, self.eos_ids, self.stops = tokenizer, set(eos_ids), stops
        self.min_tokens, self.keep_stop, self.skip_special_tokens = min_tokens, keep_stop, skip_special_tokens
        self.tokens: list[int] = []
        self.prefix = self.read = 0  # decode from prefix so leading-space rules stay right
        self.text = ""  # the row's text so far (complete characters only)
        #: A stop string counts where it ends past this many characters: none before token
        #: min_tokens, then those ending past the text before it.
        self.floor = 0 if min_tokens <= 1 else sys.maxsize
        self.sent = 0
        self.ended = False

    def _decode(self, tokens: list[int]) -> str:
        if self.skip_special_tokens:  # as any Tokenizer decodes
            return self.tokenizer.decode(tokens)
        return self.tokenizer.decode(tokens, skip_special_tokens=False)

    def add(self, token: int) -> str:
        if self.ended:
            return ""
        if int(token) in self.eos_ids:
            if self.keep_stop:
                self.tokens.append(int(token))
            self.ended = True
            return self.finish()
        if len(self.tokens) == self.min_tokens - 1:  # the text before token min_tokens
            self.floor = len(self.text)
        self.tokens.append(int(token))
        before = self._decode(self.tokens[self.prefix:self.read])
        after = self._decode(self.tokens[self.prefix:])
        if len(after) > len(before) and not after.endswith(_BROKEN):
            self.text += after[len(before):]
            self.prefix, self.read = self.read, len(self.tokens)
        return self._release(final=False)

    def finish(self) -> str:
        """The rest of the text at the end (an incomplete character shows as U+FFFD)."""
        before = self._decode(self.tokens[self.prefix:self.read])
        self.text += self._decode(self.tokens[self.prefix:])[len(before):]
        self.prefix = self.read = len(self.tokens)
        self.ended = True
        return self._release(final=True)

    def _release(self, final: bool) -> str:
        text, found = self.text, first_stop(self.text, self.stops, self.floor)
        if found is not None:
            text = text[:found[0] + len(found[1])] if self.keep_stop else text[:found[0]]
            self.ended = final = True
        end = len(text)
        if not final:  # hold back a tail that may grow into a stop string
            for s in self.stops:
                for k in range(min(len(s) - 1, len(text)), 0, -1):
                    if text.endswith(s[:k]):
                        end = min(end, len(text) - k)
                        break
        piece, self.sent = text[self.sent:end], max(self.sent, end)
        return piece


def as_prompts(x: object) -> tuple[list[str], bool] | None:
    """(texts, single) when ``x`` is a string or a list of strings, else None (token ids)."""
    if isinstance(x, str):
        return [x], True
    if isinstance(x, (list, tuple)) and x and all(isinstance(t, str) for t in x):
        return list(x), False
    return None


def require(tokenizer: Tokenizer | None, where: str) -> Tokenizer:
    if tokenizer is None:
        raise InputError(f"{where} has no tokenizer (no tokenizer.json came with it), so it takes "
                         "token ids, not text; load a checkpoint folder that holds tokenizer.json.")
    return tokenizer


def stream_text(tokenizer: Tokenizer, steps: Iterable[np.ndarray], rows: int,
                eos_ids: list[int], stops: list[str], single: bool):
    """Text pieces per step (a str for one prompt and one sequence, else a list per row),
    then the last pieces once the tokens end; joined they equal :func:`row_texts`."""
    pieces = [TextPieces(tokenizer, eos_ids, stops) for _ in range(rows)]
    for step in steps:
        out = [p.add(t) for p, t in zip(pieces, step, strict=True)]
        yield out[0] if single else out
    rest = [p.finish() if not p.ended else "" for p in pieces]
    if any(rest):
        yield rest[0] if single else rest


def _turn(runtime: Any, messages: list[dict], options: dict[str, Any], **how: Any) -> ChatTurnLike:
    if runtime.tokenizer is None:
        raise InputError("This model has no tokenizer (no tokenizer.json came with it), so it "
                         "cannot render a conversation; load a checkpoint folder that holds "
                         "tokenizer.json and a chat template.")
    return runtime.tokenizer.chat_turn(messages, options=options, **how)


def _switched(template_kwargs: dict | None, enable_thinking: bool | None,
              reasoning_effort: str | None) -> dict | None:
    """The template's keyword arguments with the thinking switches given as keywords."""
    switches = {k: v for k, v in (("enable_thinking", enable_thinking),
                                  ("reasoning_effort", reasoning_effort)) if v is not None}
    return {**(template_kwargs or {}), **switches} if switches else template_kwargs


def chat_reply(runtime: Any, messages: list[dict], *, tools: list[dict] | None = None,
               tool_choice: Any = None, chat_template: str | None = None,
               template_kwargs: dict | None = None, enable_thinking: bool | None = None,
               reasoning_effort: str | None = None, **options: Any) -> dict[str, Any]:
    """The assistant's reply to ``messages`` from ``runtime`` (a PyTorch model or an
    ``OnnxModel``, with ``tokenizer`` and ``generate``): the turn its tokenizer prepares,
    generated and read back (with ``reasoning_content`` when the template reasons).
    ``enable_thinking`` / ``reasoning_effort``: the template's thinking switches (refused where
    the template has none). The message also holds ``finish_reason`` ("stop", "length" when
    ``max_new_tokens`` cut the reply, "tool_calls"). See ``TransformerModel.chat``."""
    turn = _turn(runtime, messages, options, tools=tools, tool_choice=tool_choice,
                 chat_template=chat_template,
                 template_kwargs=_switched(template_kwargs, enable_thinking, reasoning_effort))
    reply = runtime.generate(turn.prompt, add_special_tokens=False, **turn.options)
    message = with_finish_reason(turn.message(reply), getattr(reply, "finish_reason", "stop"))
    if getattr(reply, "logprobs", None) is not None:  # the option logprobs: the tokens' reports
        message["logprobs"] = reply.logprobs
    return message


def with_finish_reason(message: dict[str, Any], reason: str) -> dict[str, Any]:
    """``message`` with OpenAI's ``finish_reason``: "tool_calls" when it calls tools, else
    ``reason`` ("length" when the budget cut the reply, "stop")."""
    return {**message, "finish_reason": "tool_calls" if message.get("tool_calls") else reason}


def _split(pieces: Iterable[str], splitter: Any, pairs: bool) -> Iterator[Any]:
    for piece in pieces:
        reasoning, content = splitter.add(piece) if splitter is not None else ("", piece)
        if reasoning or content:
            if pairs:
                yield reasoning, content
            elif content:
                yield content
    reasoning, content = splitter.finish() if splitter is not None else ("", "")
    if pairs and (reasoning or content):
        yield reasoning, content
    elif content:
        yield content


def stream_chat_reply(runtime: Any, messages: list[dict], *, tools: list[dict] | None = None,
                      tool_choice: Any = None, chat_template: str | None = None,
                      template_kwargs: dict | None = None, enable_thinking: bool | None = None,
                      reasoning_effort: str | None = None, reasoning: bool = False,
                      **options: Any) -> Iterator[Any]:
    """The assistant's reply as text pieces while it is generated: they join to
    :func:`chat_reply`'s content (the thinking left out), or to the raw text of its tool calls.
    ``reasoning=True``: (reasoning, content) pairs instead, which join to ``reasoning_content``
    and the content."""
    turn = _turn(runtime, messages, options, tools=tools, tool_choice=tool_choice,
                 chat_template=chat_template,
                 template_kwargs=_switched(template_kwargs, enable_thinking, reasoning_effort))
    pieces = runtime.stream(turn.prompt, add_special_tokens=False, **turn.options)
    return _split(pieces, turn.splitter(), reasoning)
