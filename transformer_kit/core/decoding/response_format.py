"""Structured output: a reply constrained to a JSON schema, a regular expression, a Lark grammar
or a list of choices, with llguidance (its grammars and token masks; no torch).

``response_format`` takes OpenAI's shapes and three more:

- ``{"type": "text"}``: no constraint;
- ``{"type": "json_object"}``: any JSON object;
- ``{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}``: JSON valid
  against the schema;
- ``{"type": "regex", "regex": "[0-9]{3}-[a-z]+"}``: text the expression matches whole;
- ``{"type": "choice", "choices": ["yes", "no"]}``: one of the strings;
- ``{"type": "grammar", "grammar": "start: ..."}``: llguidance's Lark (``%json {...}`` embeds a
  schema, ``<|im_end|>`` or ``<[id]>`` names a special token).

JSON is written compact (no free whitespace between tokens): a model that may write any amount
of whitespace can fill its whole budget with it.

Schemas are read leniently by default (llguidance's ``lenient`` and ``coerce_one_of``), so the
schemas people have compile: a ``format`` llguidance does not know (``url``, ``byte``) and a
keyword it does not implement (``dependencies``) are ignored, and ``oneOf`` is read as ``anyOf``
(a reply may then match more than one branch). ``"lenient": false`` in ``json_schema`` (beside
``name`` and ``schema``) refuses such a schema instead, naming what is not supported; the
schema's own ``x-guidance`` object still has the last word on llguidance's options.
"""

from __future__ import annotations

import json
import threading
from functools import lru_cache
from typing import Any

from transformer_kit.core.errors import InputError

FORMATS = ("text", "json_object", "json_schema", "regex", "choice", "grammar")
_JSON_OPTIONS = {"whitespace_flexible": False}
#: llguidance's options under a schema's own ``x-guidance``, on unless ``"lenient": false``.
LENIENT = {"lenient": True, "coerce_one_of": True}
STRICT = {"lenient": False, "coerce_one_of": False}
_lock = threading.Lock()


def _field(response_format: dict, key: str, kind: type, what: str) -> Any:
    value = response_format.get(key)
    if not isinstance(value, kind) or (kind is str and not value):
        raise InputError(f"response_format of type {response_format['type']!r} needs {key!r}: "
                         f"{what}; got {value!r:.80}.")
    return value


def grammar_of(response_format: dict | None) -> str | None:
    """The llguidance grammar ``response_format`` asks for (None: unconstrained).

    Raises :class:`InputError` naming what is wrong: an unknown type, a missing field, or a
    schema, expression or grammar that llguidance refuses (its own message).
    """
    if response_format is None:
        return None
    try:
        key = json.dumps(response_format)  # in order: properties are written in the schema's order
    except (TypeError, ValueError):
        raise InputError(f"response_format must be JSON data (dicts, lists, strings, numbers), got "
                         f"{response_format!r:.80}.") from None
    return _grammar(key)


def _json_object_grammar(response_format: dict) -> str:
    from llguidance import LLMatcher

    return LLMatcher.grammar_from_json_schema({"type": "object"}, overrides=_JSON_OPTIONS)


def _json_schema_grammar(response_format: dict) -> str:
    from llguidance import LLMatcher

    spec = _field(response_format, "json_schema", dict, "{'name': ..., 'schema': {...}}")
    schema = spec.get("schema", {"type": "object"} if "name" in spec else spec)
    if not isinstance(schema, (dict, bool)):
        raise InputError(f"response_format json_schema.schema must be a JSON schema (an "
                         f"object), got {schema!r:.80}.")
    lenient = spec.get("lenient", True) if "schema" in spec else True
    if not isinstance(lenient, bool):
        raise InputError(f"response_format json_schema.lenient must be true or false, got "
                         f"{lenient!r:.80}.")
    try:
        return LLMatcher.grammar_from_json_schema(schema, defaults=LENIENT if lenient else STRICT,
                                                  overrides=_JSON_OPTIONS)
    except (ValueError, TypeError) as exc:
        raise InputError(f"response_format json_schema cannot be used: {exc}.") from None


def _regex_grammar(response_format: dict) -> str:
    from llguidance import LLMatcher

    return LLMatcher.grammar_from_regex(_field(response_format, "regex", str, "a regular expression"))


def _choice_grammar(response_format: dict) -> str:
    from llguidance import grammar_from

    choices = _field(response_format, "choices", list, "a non-empty list of strings")
    if not choices or not all(isinstance(c, str) and c for c in choices):
        raise InputError(f"response_format choices must be non-empty strings, got {choices!r:.80}.")
    return grammar_from("choice", choices)


def _lark_grammar(response_format: dict) -> str:
    from llguidance import LLMatcher

    return LLMatcher.grammar_from_lark(_field(response_format, "grammar", str,
                                              "a Lark grammar (llguidance's)"))


#: Each constraining type of response_format -> its llguidance grammar ("text" has none).
_GRAMMARS = {"json_object": _json_object_grammar, "json_schema": _json_schema_grammar,
             "regex": _regex_grammar, "choice": _choice_grammar, "grammar": _lark_grammar}


@lru_cache(maxsize=256)
def _grammar(key: str) -> str | None:
    response_format = json.loads(key)
    if not isinstance(response_format, dict) or response_format.get("type") not in FORMATS:
        given = response_format.get("type") if isinstance(response_format, dict) else response_format
        raise InputError(f"response_format type {given!r} is not supported; give "
                         f"{{'type': ...}} with one of {', '.join(FORMATS)}.")
    from llguidance import LLMatcher

    kind = response_format["type"]
    if kind == "text":
        return None
    grammar = _GRAMMARS[kind](response_format)
    error, messages = LLMatcher.validate_grammar_with_warnings(grammar)
    if error:
        hint = (" or leave out json_schema.lenient=false (unknown formats and keywords are then "
                "ignored, oneOf read as anyOf)" if kind == "json_schema" else "")
        raise InputError(f"response_format {kind} is refused by llguidance: "
                         f"{(messages or ['invalid'])[0]}. Fix the {kind.replace('_', ' ')}{hint}.")
    return grammar


def guidance_tokenizer(tokenizer: Any, eos_ids: list[int], vocab_size: int) -> Any:
    """llguidance's tokenizer of ``tokenizer`` (a ``TextTokenizer``) ending at ``eos_ids``,
    over ``vocab_size`` columns of logits; built once per tokenizer and end ids (building one
    goes over the whole vocabulary, too long to repeat per request) and kept on it."""
    from llguidance import LLTokenizer

    key = (tuple(eos_ids), vocab_size)
    with _lock:
        cache = tokenizer.__dict__.setdefault("_guidance_tokenizers", {})
        if key not in cache:
            text = tokenizer.files["tokenizer.json"].decode("utf-8").lstrip()
            size = tokenizer.backend.get_vocab_size(with_added_tokens=True)
            if vocab_size < size:
                raise InputError(f"The model's logits have {vocab_size} columns but its tokenizer "
                                 f"has {size} tokens; structured output needs a logit per token.")
            try:
                cache[key] = LLTokenizer(text, n_vocab=vocab_size, eos_token=list(eos_ids))
            except ValueError as exc:
                raise InputError(f"llguidance cannot read this tokenizer ({exc}); structured output "
                                 "needs a byte-level or byte-fallback tokenizer.") from None
        return cache[key]
