"""Tools for a template that renders none, as docs/chat.md documents them: the system text is the
one written out here (built apart from the kit's), merged after an existing system message; the
conversation's earlier calls and results are written in the same form; bad tools are refused."""

from __future__ import annotations

import json

import pytest

from transformer_kit.chat import tool_prompt
from transformer_kit.chat.tool_calls import forced_call_grammar, parse_tool_calls, tool_names
from transformer_kit.core.errors import InputError

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather now",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}}
SEARCH = {"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}


def documented_text(tools: list[dict], closing: str) -> str:
    """The tools' text exactly as docs/chat.md shows it."""
    lines = "\n".join(json.dumps(t["function"], ensure_ascii=False) for t in tools)
    return ("You can call tools. Each tool is a JSON object on a line below: its name, what it does "
            "(description) and its parameters (a JSON schema of its arguments).\n\n"
            f"{lines}\n\n"
            "To call a tool, answer with only a JSON object of this form:\n"
            '{"tool_call": {"name": "<the tool\'s name>", "arguments": {<its arguments>}}}\n'
            'A tool\'s result comes back as {"tool_result": {"name": ..., "content": ...}}.\n'
            f"{closing}")


@pytest.mark.parametrize(("choice", "closing"), [
    ("auto", "If no tool is needed, answer in plain text."),
    ("required", "Answer now with a call to one of the tools."),
    ("search", "Answer now with a call to the tool search."),
])
def test_the_tools_text_is_the_documented_one(choice, closing):
    assert tool_prompt.tools_text([WEATHER, SEARCH], choice) == documented_text([WEATHER, SEARCH], closing)
    assert '{"name": "get_weather", "description": "Weather now", "parameters": {"type": "object"' \
        in tool_prompt.tools_text([WEATHER], choice)


def test_the_text_joins_an_existing_system_message_or_comes_first():
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert tool_prompt.with_system(chat, "TOOLS") == [{"role": "system", "content": "Be brief.\n\nTOOLS"},
                                                      chat[1]]
    assert tool_prompt.with_system(chat[1:], "TOOLS") == [{"role": "system", "content": "TOOLS"}, chat[1]]
    assert tool_prompt.with_user(chat, "TOOLS") == [chat[0], {"role": "user", "content": "TOOLS\n\nHi"}]
    assert tool_prompt.with_user([{"role": "assistant", "content": "x"}], "TOOLS") is None
    assert chat == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]


def test_earlier_calls_and_results_are_written_in_the_calls_form():
    chat = [{"role": "user", "content": "Weather in Paris and Rome?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function",
                 "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
                {"id": "c2", "type": "function",
                 "function": {"name": "get_weather", "arguments": {"city": "Rome"}}}]},
            {"role": "tool", "tool_call_id": "c1", "content": '{"degrees": 21}'},
            {"role": "tool", "tool_call_id": "c2", "content": "rain"},
            {"role": "assistant", "content": "Sunny in Paris, rain in Rome.",
             "tool_calls": [{"id": "c3", "type": "function",
                             "function": {"name": "search", "arguments": "not json"}}]},
            {"role": "tool", "name": "search", "content": "ok"}]
    assert tool_prompt.has_tool_turns(chat) and not tool_prompt.has_tool_turns(chat[:1])
    paris, rome = ('{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}',
                   '{"tool_call": {"name": "get_weather", "arguments": {"city": "Rome"}}}')
    assert tool_prompt.conversation(chat) == [
        chat[0],
        {"role": "assistant", "content": f"{paris}\n{rome}"},
        {"role": "user", "content": '{"tool_result": {"name": "get_weather", "content": {"degrees": 21}}}\n'
                                    '{"tool_result": {"name": "get_weather", "content": "rain"}}'},
        {"role": "assistant", "content": 'Sunny in Paris, rain in Rome.\n'
                                         '{"tool_call": {"name": "search", "arguments": "not json"}}'},
        {"role": "user", "content": '{"tool_result": {"name": "search", "content": "ok"}}'}]


def test_a_generic_call_is_read_back_and_anything_else_stays_content():
    names = ["get_weather"]
    text = '{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}'
    content, calls = parse_tool_calls(text, "generic", names)
    assert content is None and [(c["function"]["name"], json.loads(c["function"]["arguments"]))
                                for c in calls] == [("get_weather", {"city": "Paris"})]
    for text in ('{"tool_call": {"name": "launch", "arguments": {}}}', '{"answer": 1}', "Sunny.",
                 '{"tool_call": {"name": "get_weather", "arguments": {"city": ', ""):
        assert parse_tool_calls(text, "generic", names) == (text, [])


def test_the_generic_grammar_is_a_call_or_text_that_does_not_open_an_object():
    forced = forced_call_grammar([WEATHER, SEARCH], "search", "generic")
    assert forced.startswith("start: call\ncall: %json ") and '"const": "search"' in forced
    assert '"const": "get_weather"' not in forced and '"item_separator": ", "' in forced
    auto = forced_call_grammar([WEATHER], None, "generic", or_text=True)
    assert auto.startswith("start: call | text\n") and auto.endswith("text: /[^{][\\s\\S]*/\n")


@pytest.mark.parametrize(("tool", "words"), [
    ({"type": "function", "function": {"description": "no name"}}, ["tools[0]", "no name"]),
    ({"type": "function", "function": {"name": ""}}, ["tools[0]", "no name"]),
    ("get_weather", ["tools[0]", "no name"]),
    ({"type": "function", "function": {"name": "f", "parameters": "city: str"}},
     ["tools[0] (f)", "no JSON schema"]),
    ({"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}},
     ["type 'string'", "JSON object"]),
])
def test_a_bad_tool_is_refused_with_a_sentence(tool, words):
    with pytest.raises(InputError) as refused:
        tool_names([tool])
    assert all(w in str(refused.value) for w in words) and str(refused.value).endswith("."), refused.value


def test_parameters_no_schema_reader_takes_are_refused_naming_the_tool():
    frob = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "city": {"type": "frob"}}}}}
    for fmt in ("generic", "hermes"):
        with pytest.raises(InputError, match=r"The parameters of the tool 'f' .*\(Invalid type: frob\)"):
            forced_call_grammar([WEATHER, frob], None, fmt)
    forced_call_grammar([WEATHER, frob], "get_weather", "generic")  # f is not held to a grammar


def test_the_auto_grammar_holds_a_started_call_and_lets_text_be(chat_checkpoint):
    """llguidance's matcher over the chat checkpoint's tokenizer: a call as json.dumps writes
    it, with valid arguments, or text that does not open an object; nothing else."""
    from llguidance import LLMatcher

    from transformer_kit.core.decoding.response_format import grammar_of, guidance_tokenizer

    _, _, om, _, _ = chat_checkpoint
    tokenizer = guidance_tokenizer(om.tokenizer, list(om.manifest.eos_id), om.manifest.tgt_vocab)
    grammar = grammar_of({"type": "grammar", "grammar": forced_call_grammar([WEATHER], None, "generic",
                                                                            or_text=True)})

    def accepted(text: str) -> bool:
        matcher = LLMatcher(tokenizer, grammar)
        ids = om.tokenizer.encode([text], add_special_tokens=False)[0][0].tolist()
        return matcher.try_consume_tokens(ids) == len(ids) and matcher.is_accepting()

    assert accepted('{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}')
    assert accepted("Sunny, 21 degrees. {not a call}")
    assert not accepted('{"answer": 1}')
    assert not accepted('{"tool_call": {"name": "get_weather", "arguments": {}}}')  # city is required
    assert not accepted('{"tool_call": {"name": "search", "arguments": {}}}')
    assert not accepted('{"tool_call":{"name":"get_weather","arguments":{"city":"Paris"}}}')  # not dumps'
