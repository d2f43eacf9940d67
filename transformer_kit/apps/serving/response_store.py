"""The Responses API's memory of past replies, so that ``previous_response_id`` can continue a
conversation and ``GET /v1/responses/{id}`` read a reply again: each stored response keeps its
``response`` object and the conversation it ended (its input and its output as chat messages,
without its ``instructions``, which OpenAI does not carry over), in this process only, bounded
by a number of responses, least recently used out first."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from transformer_kit.core.errors import InputError

#: How many responses a server keeps by default (``transformer-kit serve --stored-responses``).
DEFAULT_STORED_RESPONSES = 256


class UnknownResponse(InputError):
    """A response id this server does not hold (never stored, deleted or evicted): 404."""


@dataclass(frozen=True)
class Stored:
    """One stored response: the ``response`` object as answered, and the conversation it ended
    (chat messages)."""

    response: dict[str, Any]
    conversation: list[dict[str, Any]]


class ResponseStore:
    """The last ``capacity`` responses stored (0: none kept), by id; reading one (to continue it
    or to answer it again) makes it the most recently used."""

    def __init__(self, capacity: int = DEFAULT_STORED_RESPONSES) -> None:
        if capacity < 0:
            raise InputError(f"The number of stored responses must be 0 or more; got {capacity}.")
        self.capacity = capacity
        self._held: OrderedDict[str, Stored] = OrderedDict()

    def __len__(self) -> int:
        return len(self._held)

    def put(self, ident: str, response: dict[str, Any], conversation: list[dict[str, Any]]) -> None:
        """Keep ``response`` and its ``conversation`` (chat messages) under ``ident``, evicting
        the least recently used response beyond the bound."""
        if self.capacity == 0:
            return
        self._held[ident] = Stored(response, conversation)
        self._held.move_to_end(ident)
        while len(self._held) > self.capacity:
            self._held.popitem(last=False)

    def get(self, ident: str, given_as: str = "previous_response_id") -> Stored:
        """Response ``ident`` (``given_as``: the request's name for it, said when it is not
        held). Raises UnknownResponse when it is not held."""
        if ident not in self._held:
            raise UnknownResponse(
                f"{given_as} {ident!r} is not a response this server holds: it keeps the last "
                f"{self.capacity} responses created with store=true, in memory, until it restarts "
                "or they are deleted. Send the whole conversation as input instead, or use a "
                "newer response.")
        self._held.move_to_end(ident)
        return self._held[ident]

    def conversation(self, ident: str) -> list[dict[str, Any]]:
        """The messages of the conversation response ``ident`` ended (a copy of the list).
        Raises UnknownResponse when it is not held."""
        return list(self.get(ident).conversation)

    def delete(self, ident: str) -> None:
        """Forget response ``ident``. Raises UnknownResponse when it is not held."""
        self.get(ident, "response_id")
        del self._held[ident]
