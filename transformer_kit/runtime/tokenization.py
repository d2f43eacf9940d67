"""Text to ids and back as a served model's requests see them (vLLM's ``/tokenize`` and
``/detokenize``): a prompt with the tokenizer's special tokens, or a chat rendered by the
export's template; ids read back as a reply's text. Every problem is an InputError sentence."""

from __future__ import annotations

from typing import Any

from transformer_kit.core.errors import InputError
from transformer_kit.tokenizer import TextTokenizer


def tokenize(tokenizer: TextTokenizer, prompt: str | None, messages: list[dict] | None, *,
             add_special_tokens: bool | None = None, add_generation_prompt: bool = True,
             tools: list[dict] | None = None, template_kwargs: dict[str, Any] | None = None) -> list[int]:
    """The ids of ``prompt`` (special tokens added unless ``add_special_tokens`` is False) or of
    ``messages`` (template-ready, rendered by the chat template; special tokens not added unless
    ``add_special_tokens`` is True: the template writes its own). One of the two, else InputError."""
    if (prompt is None) == (messages is None):
        given = "both" if prompt is not None else "neither"
        raise InputError(f"Give one of prompt (text) and messages (a chat); the request has {given}.")
    if prompt is not None:
        text, special = prompt, add_special_tokens is not False
    else:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                             tools=tools, **(template_kwargs or {}))
        special = bool(add_special_tokens)
    return list(tokenizer.backend.encode(text, add_special_tokens=special).ids)


def token_strings(tokenizer: TextTokenizer, ids: list[int]) -> list[str | None]:
    """Each id's token as the vocabulary writes it (byte-level pieces as they are)."""
    return [tokenizer.backend.id_to_token(i) for i in ids]


def detokenize(tokenizer: TextTokenizer, tokens: list[int], vocab: int) -> str:
    """The text of ``tokens`` (special tokens skipped, as a reply's); InputError for an id
    outside [0, ``vocab``)."""
    for i, token in enumerate(tokens):
        if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < vocab:
            raise InputError(f"tokens[{i}] is {token!r}, not an id of this model's vocabulary "
                             f"(integers 0 to {vocab - 1}); give ids the model has, e.g. those "
                             "/tokenize returns.")
    return tokenizer.decode(tokens)
