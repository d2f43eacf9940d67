"""The Responses API's memory of past replies, so that ``previous_response_id`` can continue a
conversation: each stored response keeps the conversation it ended (its input and its output
as chat messages, without its ``instructions``, which OpenAI does not carry over), in this
process only, bounded by a number of responses, least recently used out first."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from transformer_kit.errors import InputError

#: How many responses a server keeps by default (``transformer-kit serve --stored-responses``).
DEFAULT_STORED_RESPONSES = 256


class UnknownResponse(InputError):
    """A ``previous_response_id`` this server does not hold (never stored, or evicted): 404."""


class ResponseStore:
    """The conversations of the last ``capacity`` responses stored (0: none kept), by id; reading
    one (to continue it) makes it the most recently used."""

    def __init__(self, capacity: int = DEFAULT_STORED_RESPONSES) -> None:
        if capacity < 0:
            raise InputError(f"The number of stored responses must be 0 or more; got {capacity}.")
        self.capacity = capacity
        self._conversations: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._conversations)

    def put(self, ident: str, conversation: list[dict[str, Any]]) -> None:
        """Keep ``conversation`` (chat messages) under ``ident``, evicting the least recently used
        response beyond the bound."""
        if self.capacity == 0:
            return
        self._conversations[ident] = conversation
        self._conversations.move_to_end(ident)
        while len(self._conversations) > self.capacity:
            self._conversations.popitem(last=False)

    def conversation(self, ident: str) -> list[dict[str, Any]]:
        """The messages of the conversation response ``ident`` ended (a copy of the list).
        Raises UnknownResponse when it is not held."""
        if ident not in self._conversations:
            raise UnknownResponse(
                f"previous_response_id {ident!r} is not a response this server holds: it keeps the "
                f"last {self.capacity} responses created with store=true, in memory, until it "
                "restarts. Send the whole conversation as input instead, or continue a newer "
                "response.")
        self._conversations.move_to_end(ident)
        return list(self._conversations[ident])
