"""Structured output: with a response_format, even a random-weight model's reply parses and
validates, for each of twenty JSON schemas, a regular expression and a choice list, greedy and
sampled, in PyTorch and onnxruntime (alike); a format llguidance refuses is a sentence."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from tests.chat.schemas import DOZEN, DOZEN_SCHEMA, LENIENT_SCHEMAS, SCHEMAS, json_schema_format
from transformer_kit.core.errors import InputError

ASK = [{"role": "user", "content": "Answer in JSON."}]
STRATEGIES = {"greedy": {}, "sampled": {"do_sample": True, "seed": 7, "temperature": 1.5}}


@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize("name", list(SCHEMAS))
def test_every_reply_validates_against_its_schema(chat_checkpoint, name, strategy):
    _, model, om, _, _ = chat_checkpoint
    options = {"response_format": json_schema_format(name), "max_new_tokens": 48,
               **STRATEGIES[strategy]}
    replies = [runtime.chat(ASK, **options)["content"] for runtime in (model, om)]
    assert replies[0] == replies[1]
    jsonschema.validate(json.loads(replies[0]), SCHEMAS[name])


@pytest.mark.parametrize(("name", "budget"), [("nested", 20), ("nested", 27), ("weather_call", 24),
                                            ("deeply_nested", 17), ("recipe", 41)])
@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_a_reply_closes_within_a_short_budget(chat_checkpoint, name, budget, strategy):
    """Budgets just above the fewest tokens the reply can be written in (with this small
    tokenizer a key like "ingredients" takes seven): the reply is closed in time."""
    _, _, om, _, _ = chat_checkpoint
    reply = om.chat(ASK, response_format=json_schema_format(name), max_new_tokens=budget,
                    **STRATEGIES[strategy])
    jsonschema.validate(json.loads(reply["content"]), SCHEMAS[name])
    tokens = om.tokenizer.encode([reply["content"]], add_special_tokens=False)[0]
    assert tokens.shape[1] <= budget


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_json_object_regex_and_choices(chat_checkpoint, strategy):
    _, model, om, _, _ = chat_checkpoint
    for runtime in (model, om):
        reply = runtime.chat(ASK, response_format={"type": "json_object"}, max_new_tokens=32,
                             **STRATEGIES[strategy])["content"]
        assert isinstance(json.loads(reply), dict)
        reply = runtime.chat(ASK, response_format={"type": "regex", "regex": r"[0-9]{3}-[a-z]+"},
                             max_new_tokens=12, **STRATEGIES[strategy])["content"]
        assert re.fullmatch(r"[0-9]{3}-[a-z]+", reply)
        reply = runtime.chat(ASK, response_format={"type": "choice", "choices": ["yes", "no", "maybe"]},
                             max_new_tokens=12, **STRATEGIES[strategy])["content"]
        assert reply in ("yes", "no", "maybe")


def test_generate_takes_a_response_format_too(chat_checkpoint):
    _, model, om, _, _ = chat_checkpoint
    prompts = ["Answer in JSON.", "Another prompt"]
    fmt = json_schema_format("nested")
    texts = om.generate(prompts, max_new_tokens=40, response_format=fmt)
    assert texts == model.generate(prompts, max_new_tokens=40, response_format=fmt)
    for text in texts:
        jsonschema.validate(json.loads(text), SCHEMAS["nested"])


@pytest.mark.parametrize(("response_format", "says"), [
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "frob"}}}, "frob"),
    ({"type": "regex", "regex": "[0-9"}, "regex"),
    ({"type": "grammar", "grammar": "start: foo"}, "foo"),
    ({"type": "choice", "choices": []}, "choices"),
    ({"type": "xml"}, "not supported"),
])
def test_a_format_llguidance_refuses_is_a_sentence(chat_checkpoint, response_format, says):
    _, _, om, _, _ = chat_checkpoint
    with pytest.raises(InputError, match=says):
        om.chat(ASK, response_format=response_format)


def test_beam_search_with_a_grammar_is_refused(chat_checkpoint):
    _, _, om, _, _ = chat_checkpoint
    with pytest.raises(InputError, match="beam search"):
        om.generate(["x"], num_beams=2, response_format={"type": "json_object"})


@pytest.mark.parametrize("name", list(LENIENT_SCHEMAS))
def test_schemas_llguidance_reads_only_leniently_compile_and_constrain(chat_checkpoint, name):
    """By default the schema compiles and the reply validates (jsonschema ignores an unknown
    format; the oneOf branches cannot both match, which llguidance cannot prove);
    ``lenient: false`` refuses it, saying why."""
    _, model, om, _, _ = chat_checkpoint
    schema, says = LENIENT_SCHEMAS[name]
    fmt = {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}
    replies = [runtime.chat(ASK, response_format=fmt, max_new_tokens=40)["content"]
               for runtime in (model, om)]
    assert replies[0] == replies[1]
    jsonschema.validate(json.loads(replies[0]), schema)
    strict = {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "lenient": False}}
    with pytest.raises(InputError, match=f"{says}.*lenient=false"):
        om.chat(ASK, response_format=strict)
    with pytest.raises(InputError, match="lenient must be true or false"):
        om.chat(ASK, response_format={"type": "json_schema",
                                      "json_schema": {"name": name, "schema": schema, "lenient": "no"}})


@pytest.mark.parametrize("budget", [100, 150])
@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_a_dozen_required_keys_close_when_the_budget_nears_the_shortest_reply(chat_checkpoint,
                                                                           budget, strategy):
    """A random model wanders inside its first string; the way out is traced from the first
    token, so the reply closes in time even though it needs more than the last 64 tokens (the
    closing rule once started only then, and these replies did not parse). The keys come in the
    schema's order."""
    _, _, om, _, _ = chat_checkpoint
    fmt = {"type": "json_schema", "json_schema": {"name": "order", "schema": DOZEN_SCHEMA}}
    reply = om.chat(ASK, response_format=fmt, max_new_tokens=budget, **STRATEGIES[strategy])
    assert reply["finish_reason"] == "stop"
    value = json.loads(reply["content"])
    jsonschema.validate(value, DOZEN_SCHEMA)
    assert list(value) == DOZEN
    assert om.tokenizer.encode([reply["content"]], add_special_tokens=False)[0].shape[1] < budget
    shortest = json.dumps(dict.fromkeys(DOZEN, ""), separators=(",", ":"))
    assert om.tokenizer.encode([shortest], add_special_tokens=False)[0].shape[1] > 64


def test_a_budget_below_the_shortest_reply_says_length(chat_checkpoint):
    """40 tokens cannot hold the dozen keys (80): the text is the start of the way out, and the
    reply says it was cut."""
    _, _, om, _, _ = chat_checkpoint
    fmt = {"type": "json_schema", "json_schema": {"name": "order", "schema": DOZEN_SCHEMA}}
    reply = om.chat(ASK, response_format=fmt, max_new_tokens=40)
    assert reply["finish_reason"] == "length"
    assert reply["content"].startswith('{"name":')
    with pytest.raises(json.JSONDecodeError):
        json.loads(reply["content"])
