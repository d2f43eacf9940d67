"""Tool calls read back from a model's text in each format, and what is not a call stays text."""

from __future__ import annotations

import json

import pytest

from transformer_kit.chat.tool_calls import call_format, parse_tool_calls, tool_names
from transformer_kit.core.errors import InputError

NAMES = ["get_weather", "search"]


def _calls(calls):
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


def test_hermes_blocks_become_tool_calls_and_the_rest_stays_content():
    text = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
            '</tool_call>\n<tool_call>{"name": "search", "arguments": "{\\"q\\": \\"x\\"}"}</tool_call>')
    content, calls = parse_tool_calls(text, "hermes", NAMES)
    assert content == "Let me check."
    assert _calls(calls) == [("get_weather", {"city": "Paris"}), ("search", {"q": "x"})]
    assert len({c["id"] for c in calls}) == 2


@pytest.mark.parametrize("text", [
    '<tool_call>{"name": "get_weather", "arguments": {"city": </tool_call>',  # broken JSON
    '<tool_call>{"name": "launch", "arguments": {}}</tool_call>',  # no such tool
    "Just an answer.",
])
def test_what_is_not_a_call_of_a_given_tool_stays_content(text):
    assert parse_tool_calls(text, "hermes", NAMES) == (text, [])


def test_llama3_json_calls_are_read():
    content, calls = parse_tool_calls('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Rome"}};'
                                      '{"name": "search", "parameters": {"q": "y"}}', "llama3", NAMES)
    assert content is None
    assert _calls(calls) == [("get_weather", {"city": "Rome"}), ("search", {"q": "y"})]
    assert parse_tool_calls('{"answer": 1}', "llama3", NAMES) == ('{"answer": 1}', [])


def test_the_format_follows_the_template():
    assert call_format("{{ '<tool_call>' }}") == "hermes"
    assert call_format('{{- \'{"name": function name, "parameters": ...}\' }}') == "llama3"


def test_a_tool_without_a_name_is_refused_with_a_sentence():
    assert tool_names([{"type": "function", "function": {"name": "f"}}, {"name": "g"}]) == ["f", "g"]
    with pytest.raises(InputError, match="A tool must be"):
        tool_names([{"type": "function", "function": {"description": "no name"}}])
