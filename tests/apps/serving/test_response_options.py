"""``POST /v1/responses``' options beyond the conversation (apps/serving/response_options.py) on
127.0.0.1, over the chat checkpoint of tests/chat/checkpoint.py: the request bodies the OpenAI
Agents SDK sent (recorded in data/agents_sdk_requests.json) replayed, a tool call and then the
answer after the tool's output, each equal to the kit's own greedy reply on
``/v1/chat/completions``, streamed or not; an empty ``include`` accepted and every value OpenAI
defines served or refused by name, log probabilities behind their one switch; the options the
SDK may send (``truncation``, ``store``, ``metadata``, ``parallel_tool_calls``, the prompt
cache's hints, ``service_tier``, ``safety_identifier``, ``user``) echoed with the same reply;
``truncation: "auto"`` dropping the oldest items until the conversation fits; the streams'
obfuscation; ``reasoning.effort`` rendered by gpt-oss's template and refused by one without the
switch; the fields OpenAI defines that are not served refused by name with the reason."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import httpx
import jsonschema
import pytest

import transformer_kit as tk
from tests.apps.serving.conftest import record_prompts
from tests.apps.serving.test_chat import WEATHER, _client, chat_export  # noqa: F401
from tests.chat.reasoning_checkpoint import write_reasoning_checkpoint
from transformer_kit.apps.serving import response_options
from transformer_kit.apps.serving.http import create_app
from transformer_kit.apps.serving.http import serve_in_thread as running
from transformer_kit.export import export_onnx
from transformer_kit.runtime import Engine, OnnxModel, Service

#: What the Agents SDK sent, per run (Runner.run, Runner.run_streamed): [the first turn, the turn
#: after the tool's output].
RECORDED = json.loads((Path(__file__).parent / "data" / "agents_sdk_requests.json").read_text())
QUESTION = "What is the weather in Paris?"
TOOL = {"type": "function", **WEATHER["function"]}


@pytest.fixture(scope="module")
def server(chat_export):  # noqa: F811
    """(base URL, the prompts the engine was given, in order)."""
    _, om = chat_export
    engine = Engine(om, max_batch=8, max_queue=64)
    prompts = record_prompts(engine)
    with running(create_app(engine, "chat")) as url:
        yield url, prompts
    engine.close()


def _post(url: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}/v1/responses", json=body, timeout=120)


def _events(url: str, body: dict) -> list[dict]:
    """The data of each server-sent event of a streamed response."""
    with httpx.stream("POST", f"{url}/v1/responses", json=body, timeout=120) as response:
        assert response.status_code == 200, response.read()
        return [json.loads(line[len("data: "):]) for line in response.iter_lines()
                if line.startswith("data: ")]


def _answered(url: str, body: dict, streamed: bool) -> dict:
    """The finished response to ``body``: the answer, or the last event's response."""
    if not streamed:
        response = _post(url, body)
        assert response.status_code == 200, response.text
        return response.json()
    events = _events(url, body)
    assert events[-1]["type"] == "response.completed", events[-1]
    return events[-1]["response"]


def _chat(url: str, messages: list[dict], **fields) -> dict:
    """The kit's own greedy reply's message on /v1/chat/completions."""
    reply = httpx.post(f"{url}/v1/chat/completions", json={"model": "chat", "messages": messages,
                                                           "temperature": 0, **fields}, timeout=120)
    assert reply.status_code == 200, reply.text
    return reply.json()["choices"][0]["message"]


@pytest.mark.parametrize("run", ["run", "run_streamed"])
def test_the_agents_sdks_requests_replayed_call_the_tool_then_answer_as_chat_does(server, run):
    url, prompts = server
    first, second = copy.deepcopy(RECORDED[run])
    assert first["include"] == [] and first["tool_choice"] == "required" and "tool_choice" not in second
    assert first.get("stream", False) == second.get("stream", False) == (run == "run_streamed")
    streamed = run == "run_streamed"
    called = _answered(url, first, streamed)
    assert [item["type"] for item in called["output"]] == ["function_call"]
    call = called["output"][0]
    assert call["name"] == "get_weather" and called["status"] == "completed"
    assert called["tool_choice"] == "required" and called["text"]["format"] == first["text"]["format"]
    # the kit's own forced call: tool_choice required writes a call, so text.format waits
    system = {"role": "system", "content": first["instructions"]}
    keys = ("name", "description", "parameters")
    tools = [{"type": "function", "function": {key: tool[key] for key in keys}} for tool in first["tools"]]
    forced = _chat(url, [system, {"role": "user", "content": QUESTION}], tools=tools,
                   tool_choice="required", max_tokens=first["max_output_tokens"])
    assert [c["function"]["arguments"] for c in forced["tool_calls"]] == [call["arguments"]]

    # the SDK's next turn: the answered call item as it came, then the tool's output
    recorded_call, recorded_output = second["input"][1], second["input"][2]
    assert set(recorded_call) == set(call) and set(recorded_output) == {"call_id", "output", "type"}
    city = json.loads(call["arguments"])["city"]
    second["input"][1:3] = [call, {"call_id": call["call_id"], "output": f"sunny in {city}",
                                   "type": "function_call_output"}]
    answer = _answered(url, second, streamed)
    prompt = prompts[-1]
    assert [item["type"] for item in answer["output"]] == ["message"] and answer["status"] == "completed"
    text = answer["output"][0]["content"][0]["text"]
    expected = _chat(url, [system, {"role": "user", "content": QUESTION},
                           {"role": "assistant", "content": None, "tool_calls": forced["tool_calls"]},
                           {"role": "tool", "tool_call_id": call["call_id"], "content": f"sunny in {city}"}],
                     tools=tools, max_tokens=second["max_output_tokens"],
                     response_format={"type": "json_schema", "json_schema": {
                         key: value for key, value in second["text"]["format"].items() if key != "type"}})
    assert prompts[-1] == prompt  # the same rendered conversation
    assert text == expected["content"]
    jsonschema.validate(json.loads(text), second["text"]["format"]["schema"])  # the SDK parses it
    assert answer["usage"]["output_tokens"] >= 1 and answer["instructions"] == first["instructions"]


def test_an_empty_include_is_the_reply_without_one(server):
    url, _ = server
    plain = _post(url, {"model": "chat", "input": QUESTION, "max_output_tokens": 12, "temperature": 0})
    empty = _post(url, {"model": "chat", "input": QUESTION, "max_output_tokens": 12, "temperature": 0,
                        "include": []})
    assert empty.status_code == plain.status_code == 200
    assert empty.json()["output"][0]["content"] == plain.json()["output"][0]["content"]
    assert empty.json()["output"][0]["content"][0]["text"]


def _refused(url: str, body: dict, *words: str, param: str | None = None) -> str:
    response = _post(url, {"model": "chat", "input": "Hi", **body})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["message"].endswith(".") and all(w in error["message"] for w in words), error
    assert error["param"] == param
    return error["message"]


@pytest.mark.parametrize("value", sorted(response_options.INCLUDE_REFUSALS))
def test_each_include_value_openai_defines_is_refused_by_name_with_the_reason(server, value):
    url, _ = server
    message = _refused(url, {"include": [value]}, f"include[0] is {value!r}", "not served",
                       "leave it out of include")
    assert response_options.INCLUDE_REFUSALS[value] in message


def test_log_probabilities_are_served_with_include_and_refused_without(server):
    url, _ = server
    _refused(url, {"top_logprobs": 2}, "top_logprobs is 2", "include does not ask")
    _refused(url, {"include": ["message.output_text.logprobs", "nonsense"]}, "include[1]")
    _refused(url, {"include": ["nonsense"]}, "include[0] is 'nonsense'", "none of the values",
             "'reasoning.encrypted_content'")
    served = _post(url, {"model": "chat", "input": "Hi", "max_output_tokens": 2, "temperature": 0,
                         "include": [response_options.LOGPROBS_INCLUDE], "top_logprobs": 2})
    assert served.status_code == 200 and served.json()["top_logprobs"] == 2
    part = served.json()["output"][0]["content"][0]
    assert len(part["logprobs"]) == 2 and all(len(e["top_logprobs"]) == 2 for e in part["logprobs"])


#: The options the Agents SDK's ModelSettings (and extra_args) may add to a request, each served:
#: the reply is the same, the response says what was asked.
OPTIONS = {"truncation": "auto", "store": False, "metadata": {"run": "7"}, "parallel_tool_calls": True,
           "prompt_cache_key": "agents-sdk:run:1", "prompt_cache_retention": "in_memory",
           "service_tier": "auto", "safety_identifier": "user-1", "user": "me", "top_p": 1.0,
           "text": {"format": {"type": "text"}, "verbosity": "medium"}, "reasoning": {"effort": None}}


def test_the_options_the_sdk_may_send_are_served_with_the_same_reply(server):
    url, _ = server
    body = {"model": "chat", "input": QUESTION, "max_output_tokens": 12, "temperature": 0, "tools": [TOOL]}
    plain = _post(url, body).json()
    each = _post(url, {**body, **OPTIONS}).json()
    assert each["output"][0]["content"] == plain["output"][0]["content"]
    expected = {**OPTIONS, "service_tier": "default", "reasoning": {"effort": None, "summary": None}}
    assert {key: each[key] for key in OPTIONS} == expected
    assert (plain["truncation"], plain["store"], plain["service_tier"], plain["prompt_cache_key"],
            plain["text"]["verbosity"]) == ("disabled", True, "default", None, "medium")
    assert _post(url, {"model": "chat", "input": "Hi", "previous_response_id": each["id"]}).status_code == 404


@pytest.mark.parametrize(("body", "words"), [
    ({"service_tier": "flex"}, ("service_tier is 'flex'", "one tier", "'default'")),
    ({"prompt_cache_retention": "24h"}, ("prompt_cache_retention is '24h'", "in memory", "'in_memory'")),
    ({"text": {"verbosity": "low"}}, ("text.verbosity is 'low'", "'medium'")),
    ({"reasoning": {"summary": "auto"}}, ("reasoning.summary is 'auto'", "no reasoning items")),
    ({"reasoning": {"generate_summary": "concise"}}, ("reasoning.summary is 'concise'",)),
    ({"reasoning": {"effort": "low"}}, ("reasoning.effort is 'low'", "no reasoning_effort switch")),
    ({"stream_options": {"include_obfuscation": False}}, ("stream_options is only allowed with stream",)),
    ({"tools": [{**TOOL, "defer_loading": True}]}, ("tools[0] ('get_weather') has 'defer_loading'",
                                                    "strict")),
])
def test_an_option_that_would_not_take_effect_is_refused_with_a_sentence(server, body, words):
    url, _ = server
    _refused(url, body, *words)


@pytest.mark.parametrize("field", sorted(response_options.NOT_SERVED))
def test_the_fields_openai_defines_that_are_not_served_are_refused_by_name(server, field):
    url, _ = server
    message = _refused(url, {field: "x"}, f"{field!r} is not served", param=field)
    assert response_options.NOT_SERVED[field] in message
    other = _refused(url, {"frobnicate": 1}, "Unknown field 'frobnicate'", "/v1/responses takes",
                     param="frobnicate")
    assert field not in other.split("takes")[0]


def test_a_stream_is_obfuscated_unless_asked_not_to_and_still_joins(server):
    url, _ = server
    body = {"model": "chat", "input": QUESTION, "max_output_tokens": 16, "temperature": 0, "stream": True}
    whole = _post(url, {**body, "stream": False}).json()["output"][0]["content"][0]["text"]
    for options, obfuscated in ((None, True), ({"include_obfuscation": True}, True),
                                ({"include_obfuscation": False}, False)):
        given = body if options is None else {**body, "stream_options": options}
        deltas = [e for e in _events(url, given) if e["type"] == "response.output_text.delta"]
        assert deltas and "".join(e["delta"] for e in deltas) == whole
        marks = [e.get("obfuscation") for e in deltas]
        if obfuscated:
            assert all(isinstance(m, str) and 1 <= len(m) <= 32 for m in marks), marks
        else:
            assert marks == [None] * len(marks)
    assert len({len(e) for e in (response_options.obfuscation() for _ in range(64))}) > 1  # sizes vary


def test_truncation_auto_drops_the_oldest_items_until_the_conversation_fits(chat_export):  # noqa: F811
    _, om = chat_export
    engine = Engine(om, max_batch=4)
    prompts = record_prompts(engine)
    system = {"role": "system", "content": "Be brief."}
    arguments = '{"city": "Paris"}'
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
    turns = [{"role": "user", "content": f"Tell me about the weather in city number {i}."} if i % 2 == 0
             else {"role": "assistant", "content": f"It is sunny in city {i}, 21 degrees."} for i in range(5)]
    items = [{"role": "user", "content": QUESTION},
             {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": arguments},
             {"type": "function_call_output", "call_id": "c1", "output": "sunny"}, *turns]
    as_chat = [{"role": "user", "content": QUESTION},
               {"role": "assistant", "content": None, "tool_calls": [call]},
               {"role": "tool", "tool_call_id": "c1", "content": "sunny"}, *turns]

    def tokens(messages: list[dict]) -> int:
        return len(Service(engine).tokenize(messages=[system, *messages], tools=[WEATHER])[0])

    # the bound leaves out the question and the call; the call's output would fit, but it goes
    # with its call: 3 items go
    bound = tokens(as_chat[2:])
    assert tokens(as_chat[1:]) > bound > tokens(turns)
    with running(create_app(engine, "chat", max_prompt_tokens=bound)) as url:
        body = {"model": "chat", "input": items, "instructions": "Be brief.", "max_output_tokens": 8,
                "temperature": 0, "tools": [TOOL]}
        refused = _post(url, body)
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "context_length_exceeded"
        answered = _post(url, {**body, "truncation": "auto"})
        assert answered.status_code == 200, answered.text
        assert answered.json()["truncation"] == "auto"
        prompt = prompts[-1]
        expected = _chat(url, [system, *turns], max_tokens=8, tools=[WEATHER])
        assert prompts[-1] == prompt and len(prompt) == tokens(turns)  # the same rendered conversation
        assert answered.json()["output"][0]["content"][0]["text"] == (expected["content"] or "")
        one = _post(url, {**body, "input": [{"role": "user", "content": "weather " * bound}],
                          "truncation": "auto"})
        assert one.status_code == 400 and one.json()["error"]["code"] == "context_length_exceeded"
    engine.close()


def test_reasoning_effort_is_the_harmony_templates_switch(tmp_path):
    chain = [["assistant", "<|channel|>", "analysis", "<|message|>", "The user asks", "<|end|>",
              "<|start|>", "assistant"]]
    folder = write_reasoning_checkpoint(tmp_path / "model", "harmony", chain)
    export_onnx(tk.from_hf(folder), folder / "onnx")
    om = OnnxModel(folder / "onnx", providers="cpu")
    engine = Engine(om, max_batch=2)
    prompts = record_prompts(engine)
    question = [{"role": "user", "content": QUESTION}]
    with running(create_app(engine, "m")) as url:
        for effort in ("low", "high"):
            response = httpx.post(f"{url}/v1/responses", json={
                "model": "m", "input": question, "max_output_tokens": 4, "temperature": 0,
                "reasoning": {"effort": effort}}, timeout=120)
            assert response.status_code == 200, response.text
            assert response.json()["reasoning"] == {"effort": effort, "summary": None}
            rendered = om.tokenizer.apply_chat_template(question, reasoning_effort=effort)
            assert prompts[-1] == om.tokenizer.encode([rendered], add_special_tokens=False)[0][0].tolist()
            assert f"Reasoning: {effort}" in rendered
        wrong = httpx.post(f"{url}/v1/responses", json={"model": "m", "input": "Hi",
                                                        "reasoning": {"effort": "minimal"}})
        assert wrong.status_code == 400
        assert "reasoning.effort is 'minimal'" in wrong.json()["error"]["message"]
        assert "'low', 'medium', 'high'" in wrong.json()["error"]["message"]
    engine.close()
