"""A conversation held turn after turn with an export's chat model, run directly on its
``OnnxModel``: what the command line's ``chat`` talks to.

Each turn renders the history and the user's text with the export's chat template (a
:class:`~transformer_kit.chat.conversation.ChatTurn`, as :meth:`~.service.Service.chat` renders
one), gives the reply the tokens asked for or the room the context has left
(:func:`~transformer_kit.chat.conversation.reply_budget`), streams the reply's text as it is
generated, and keeps the completed reply in the history.

    session = ChatSession(model, "You answer in a few words.", max_new_tokens=64)
    for piece in session.reply("Hello"):
        print(piece, end="", flush=True)
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

from transformer_kit.chat.conversation import DEFAULT_REPLY_TOKENS, ChatTurn, reply_budget
from transformer_kit.core.decoding import generation_config
from transformer_kit.core.decoding.defaults import with_defaults
from transformer_kit.core.decoding.text import require
from transformer_kit.core.errors import InputError
from transformer_kit.runtime.onnx_model import OnnxModel

__all__ = ["DEFAULT_REPLY_TOKENS", "ChatSession", "check_reply_options"]


def check_reply_options(max_new_tokens: int | None, **options: Any) -> None:
    """Raise InputError for generation options a reply cannot take (``max_new_tokens`` None:
    the default budget), without the warnings a turn gives about them."""
    with warnings.catch_warnings():  # a turn warns about its options; once is enough
        warnings.simplefilter("ignore")
        budget = DEFAULT_REPLY_TOKENS if max_new_tokens is None else max_new_tokens
        generation_config(**with_defaults(None, options), max_new_tokens=budget)


class ChatSession:
    """The messages so far (the system message first) and the generation options of a reply.

    Args:
        model: an export with a tokenizer and a chat template.
        system: the system message, or None.
        max_new_tokens: tokens per reply at most; None: :data:`DEFAULT_REPLY_TOKENS`, or the
            room the model's context has left after the conversation (``reply_budget``).
        chat_template: a template's name (``tool_use``) or text instead of the export's default.
        options: the other generation options (``response_format`` among them).

    Raises InputError at once for bad options, an export without a tokenizer, or a template
    it does not have.
    """

    def __init__(self, model: OnnxModel, system: str | None = None, *,
                 max_new_tokens: int | None = None, chat_template: str | None = None,
                 **options: Any) -> None:
        check_reply_options(max_new_tokens, **options)
        self.tokenizer = require(model.tokenizer, str(model.path))
        self.tokenizer.chat_template(chat_template)  # the template exists
        self.model, self.max_new_tokens, self.options = model, max_new_tokens, options
        self.chat_template = chat_template
        self.start = [] if system is None else [{"role": "system", "content": system}]
        #: The conversation so far, OpenAI-style messages.
        self.messages = list(self.start)

    def reset(self) -> None:
        """Forget every turn; the system message stays."""
        self.messages = list(self.start)

    def reply(self, text: str) -> Iterator[str]:
        """The assistant's reply to the user's ``text``, in pieces as it is generated (the raw
        text, a reasoning template's markup included); the turn joins the history once the
        reply is complete (a reply left unfinished is dropped)."""
        for piece, _ in self._pieces(text):
            yield piece

    def reply_parts(self, text: str) -> Iterator[tuple[str, str]]:
        """As :meth:`reply`, each piece read as (reasoning, content): a reasoning template's
        thinking apart from the answer, without their markup (all content for other templates)."""
        for _, parts in self._pieces(text):
            if any(parts):
                yield parts

    def _pieces(self, text: str) -> Iterator[tuple[str, tuple[str, str]]]:
        """(raw piece, its (reasoning, content)) as generated; the last has an empty raw piece
        and what the reasoning reader held back. The turn joins the history at the end."""
        messages = [*self.messages, {"role": "user", "content": text}]
        turn = ChatTurn(self.tokenizer, messages, chat_template=self.chat_template, options=self.options)
        splitter, pieces = turn.splitter(), []
        for piece in self.model.stream(turn.prompt, add_special_tokens=False,
                                       **{**turn.options, "max_new_tokens": self.budget(turn.prompt)}):
            pieces.append(piece)
            yield piece, ("", piece) if splitter is None else splitter.add(piece)
        if splitter is not None:
            yield "", splitter.finish()
        # the reply as the assistant's message: a reasoning template's thinking apart (gpt-oss's
        # template refuses channel markup in a message's content)
        self.messages = [*messages, turn.message("".join(pieces))]

    def budget(self, prompt: str) -> int:
        """The tokens a reply to the rendered ``prompt`` may take: ``max_new_tokens``, else the
        default bounded by the room the context leaves (InputError when it leaves none)."""
        if self.max_new_tokens is not None:
            return self.max_new_tokens
        context = self.model.context_length
        if context is None:
            return DEFAULT_REPLY_TOKENS
        used = self.tokenizer.encode([prompt], add_special_tokens=False)[0].shape[1]
        budget = reply_budget(used, context)
        if budget < 1:
            raise InputError(f"The conversation takes {used} tokens, and the model's context holds "
                             f"{context}, so no reply fits; start a shorter conversation (/reset "
                             "in a session).")
        return budget
