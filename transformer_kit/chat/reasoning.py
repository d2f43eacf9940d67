"""Reasoning: the thinking a reply writes before its answer, split from the answer as the chat
template's markup says, whether the reply comes whole or in streamed pieces.

Formats (chosen by the template's text, :func:`reasoning_format`):

- ``"think"``: ``<think>...</think>`` then the answer (Qwen3, SmolLM3, DeepSeek-R1 distills).
  A template whose generation prompt ends inside an open ``<think>`` (the R1 distills') starts
  the reply in the thinking.
- ``"harmony"``: gpt-oss's channels (openai/harmony): messages ``<|channel|>analysis<|message|>
  ...<|end|>`` (the thinking), ``<|start|>assistant<|channel|>final<|message|>...`` (the answer),
  and tool calls ``<|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>{...}``
  (the recipient may also follow the channel). ``commentary`` without a recipient is a preamble
  shown to the user (answer text).

:class:`Splitter` reads a reply piece by piece; the whole reply is the same reading fed at once, so
a stream's pieces join to exactly the whole reply's ``reasoning_content`` and ``content``.
"""

from __future__ import annotations

import re

#: The special tokens of harmony's markup, kept in the decoded text of a harmony model (decoding
#: skips special tokens otherwise, and the channels could not be read back).
HARMONY_MARKUP = ("<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|constrain|>")
_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"
_MESSAGE = "<|message|>"
_BODY_ENDS = ("<|end|>", "<|call|>", "<|return|>")
_HEADER_STARTS = ("<|channel|>", "<|start|>", " to=")
_CHANNEL = re.compile(r"<\|channel\|>\s*(\w+)")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
#: The template variables that switch thinking, and the values a request may give them.
SWITCHES = {"enable_thinking": (True, False), "reasoning_effort": ("low", "medium", "high")}


def reasoning_format(template: str) -> str | None:
    """``"harmony"``, ``"think"`` or None (the template writes no reasoning markup)."""
    if "<|channel|>" in template and "analysis" in template:
        return "harmony"
    if _THINK_CLOSE in template:
        return "think"
    return None


def opens_thinking(prompt: str) -> bool:
    """Whether a rendered prompt leaves a ``<think>`` block open (the reply starts thinking)."""
    return prompt.rstrip().endswith(_THINK_OPEN)


def _held_tail(text: str, markers: tuple[str, ...]) -> int:
    """How many characters at the end of ``text`` may be the start of one of ``markers``."""
    for k in range(min(max(len(m) for m in markers) - 1, len(text)), 0, -1):
        if any(m.startswith(text[-k:]) for m in markers):
            return k
    return 0


class Splitter:
    """One reply read as it arrives: :meth:`add` takes the next text and returns the (reasoning,
    content) it releases; :meth:`finish` releases what was held (a possible marker's start).
    ``reasoning`` is None until the reply thinks; ``calls``: harmony's tool calls, (function
    name, arguments text)."""

    def __init__(self, fmt: str, thinking: bool = False) -> None:
        self.fmt = fmt
        self.state = "think" if thinking else "start"
        self.buffer = ""
        self.reasoning: str | None = "" if thinking else None
        self.content = ""
        self.calls: list[tuple[str, str]] = []
        self._pending_space = ""  # reasoning's trailing whitespace, sent once more text follows
        self._channel: tuple[str, str | None] = ("final", None)
        self._messages = 0  # harmony analysis messages begun (joined with a newline)

    # -- released text, kept in step with what the caller saw ---------------------------------
    def _think(self, text: str) -> str:
        """Reasoning text, stripped of whitespace at its start and (held until more comes) end."""
        if self.reasoning is None:
            self.reasoning = ""
        if not self.reasoning:
            text = text.lstrip()
        if not text:
            return ""
        text = self._pending_space + text
        body = text.rstrip()
        self._pending_space = text[len(body):]
        self.reasoning += body
        return body

    def _say(self, text: str) -> str:
        self.content += text
        return text

    def add(self, text: str) -> tuple[str, str]:
        """The next piece of the reply -> (reasoning, content) released by it."""
        self.buffer += text
        reasoning, content = [], []
        while True:
            step = self._think_step(reasoning, content) if self.fmt == "think" else \
                self._harmony_step(reasoning, content)
            if not step:
                return "".join(reasoning), "".join(content)

    def finish(self) -> tuple[str, str]:
        """(reasoning, content) held back at the end of the reply."""
        rest, self.buffer = self.buffer, ""
        self._pending_space = ""
        if self.state in ("think", "body") and self._channel_kind() == "reasoning":
            return self._think(rest), ""
        if self.state == "body" and self._channel_kind() == "call":
            self.calls[-1] = (self.calls[-1][0], self.calls[-1][1] + rest)
            return "", ""
        if self.state == "after":
            rest = rest.lstrip()
        return "", self._say(rest)

    def _channel_kind(self) -> str:
        if self.fmt == "think":
            return "reasoning" if self.state == "think" else "content"
        channel, recipient = self._channel
        if recipient is not None and recipient.startswith("functions."):
            return "call"
        return "reasoning" if channel == "analysis" else "content"

    # -- <think>...</think> -------------------------------------------------------------------
    def _think_step(self, reasoning: list[str], content: list[str]) -> bool:
        buffer = self.buffer
        if self.state == "start":
            head = buffer.lstrip()
            if head.startswith(_THINK_OPEN):
                self.buffer, self.state = head[len(_THINK_OPEN):], "think"
                self.reasoning = ""
                return True
            if _THINK_OPEN.startswith(head):  # nothing yet, or a part of <think>
                return False
            self.state = "answer"
            return True
        if self.state == "think":
            end = buffer.find(_THINK_CLOSE)
            if end >= 0:
                reasoning.append(self._think(buffer[:end]))
                self._pending_space = ""
                self.buffer, self.state = buffer[end + len(_THINK_CLOSE):], "after"
                return True
            keep = _held_tail(buffer, (_THINK_CLOSE,))
            reasoning.append(self._think(buffer[:len(buffer) - keep]))
            self.buffer = buffer[len(buffer) - keep:]
            return False
        if self.state == "after":
            self.buffer = buffer.lstrip()
            if not self.buffer:
                return False
            self.state = "answer"
            return True
        content.append(self._say(buffer))
        self.buffer = ""
        return False

    # -- harmony channels ---------------------------------------------------------------------
    def _harmony_step(self, reasoning: list[str], content: list[str]) -> bool:
        if self.state in ("start", "header"):
            return self._header_step()
        buffer = self.buffer
        if self.state == "body":
            ends = [(buffer.find(m), m) for m in _BODY_ENDS if m in buffer]
            if ends:
                at, marker = min(ends)
                self._release(buffer[:at], reasoning, content)
                self._pending_space = ""  # each message's trailing whitespace dropped
                self.buffer, self.state = buffer[at + len(marker):], "header"
                return True
            keep = _held_tail(buffer, _BODY_ENDS)
            self._release(buffer[:len(buffer) - keep], reasoning, content)
            self.buffer = buffer[len(buffer) - keep:]
            return False
        content.append(self._say(buffer))
        self.buffer = ""
        return False

    def _header_step(self) -> bool:
        """Read a message's header (its channel and recipient) once its <|message|> came."""
        buffer = self.buffer
        if self.state == "start":
            head = buffer.lstrip("\n")
            if not any(m.startswith(head) or head.startswith(m) for m in _HEADER_STARTS):
                self.state = "answer"  # no markup at all: the text is the answer
                return True
            if not any(head.startswith(m) for m in _HEADER_STARTS):
                return False
            self.state = "header"
        end = buffer.find(_MESSAGE)
        if end < 0:
            return False
        header = buffer[:end]
        channel, recipient = _CHANNEL.search(header), _RECIPIENT.search(header)
        self._channel = (channel.group(1) if channel else "final",
                         recipient.group(1) if recipient else None)
        self.buffer, self.state = buffer[end + len(_MESSAGE):], "body"
        kind = self._channel_kind()
        if kind == "call":
            self.calls.append((self._channel[1].removeprefix("functions."), ""))
        elif kind == "reasoning":
            if self._messages:
                self._pending_space += "\n"
            self._messages += 1
        return True

    def _release(self, text: str, reasoning: list[str], content: list[str]) -> None:
        kind = self._channel_kind()
        if kind == "call":
            self.calls[-1] = (self.calls[-1][0], self.calls[-1][1] + text)
        elif kind == "reasoning":
            reasoning.append(self._think(text))
        else:
            content.append(self._say(text))


def split(text: str, fmt: str, thinking: bool = False) -> Splitter:
    """A whole reply read at once (its ``reasoning``, ``content`` and ``calls``)."""
    splitter = Splitter(fmt, thinking)
    splitter.add(text)
    splitter.finish()
    return splitter
