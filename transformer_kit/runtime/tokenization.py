"""Text to ids and back as a served model's requests see them (vLLM's ``/tokenize`` and
``/detokenize``): a prompt with the tokenizer's special tokens, or a chat rendered by the
export's template; ids read back as a reply's text. Every problem is an InputError sentence."""

from __future__ import annotations

import json
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


#: The fields of a serialised ``AddedToken`` (a special token in tokenizer_config.json).
_ADDED_TOKEN = {"__type", "content", "lstrip", "rstrip", "normalized", "single_word", "special"}
#: Paths to files on the machine that wrote the config, which vLLM leaves out too.
_FILE_FIELDS = ("vocab_file", "merges_file", "tokenizer_file")


def _plain(value: Any) -> Any:
    """A config value with each serialised ``AddedToken`` as its text, as vLLM writes the
    tokens transformers loaded (``added_tokens_decoder``: id -> text)."""
    if isinstance(value, dict):
        if isinstance(value.get("content"), str) and set(value) <= _ADDED_TOKEN:
            return value["content"]
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


def tokenizer_info(tokenizer: TextTokenizer | None) -> dict[str, Any]:
    """vLLM's ``/tokenizer_info`` of ``tokenizer``: its tokenizer_config.json (the settings
    transformers loads it with, special tokens as their text, no file paths), its named special
    tokens (``bos_token``, ``eos_token``...: special_tokens_map.json's where the config leaves
    them out), ``added_tokens_decoder`` (id -> text; tokenizer.json's added tokens where the
    config has none), ``tokenizer_class`` (the config's, else ``PreTrainedTokenizerFast``, what
    transformers loads a bare tokenizer.json as) and ``chat_template``: the default template's
    text, or name -> text when there are several (left out without any). InputError for none."""
    if tokenizer is None:
        raise InputError("This export has no tokenizer (no tokenizer.json came with it), so there is "
                         "no tokenizer configuration to give; export a checkpoint that holds its "
                         "tokenizer.")
    try:
        config = json.loads(tokenizer.files.get("tokenizer_config.json", b"{}"))
    except ValueError:  # a config transformers could not read either: the rest still holds
        config = {}
    info = {key: _plain(value) for key, value in (config if isinstance(config, dict) else {}).items()
            if key not in _FILE_FIELDS and key != "chat_template"}
    info.update(tokenizer.special_tokens)
    if "added_tokens_decoder" not in info:  # transformers reads them from tokenizer.json then
        added = tokenizer.backend.get_added_tokens_decoder()
        info["added_tokens_decoder"] = {str(i): added[i].content for i in sorted(added)}
    info["tokenizer_class"] = info.get("tokenizer_class") or "PreTrainedTokenizerFast"
    templates = tokenizer.chat_templates
    if templates:
        info["chat_template"] = (templates["default"] if list(templates) == ["default"]
                                 else dict(templates))
    return info
