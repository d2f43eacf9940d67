"""``POST /v1/responses`` on 127.0.0.1 with the official ``openai`` client's
``responses.create``, over the chat checkpoint of tests/chat/checkpoint.py: greedy output equals
``/v1/chat/completions`` for the same messages; streamed events come in the Responses order and
join to the reply; JSON schemas hold; a forced function call goes round trip through a
``function_call_output`` item, and is answered on a template that renders no tools;
``previous_response_id`` continues a conversation within the store's bound;
``responses.retrieve`` reads a stored response as it was answered and ``responses.delete``
forgets it; bad requests get 400 with a sentence."""

from __future__ import annotations

import json
import time

import httpx
import jsonschema
import openai
import pytest

from tests.apps.serving.conftest import record_prompts
from tests.apps.serving.test_chat import (  # noqa: F401
    CONVERSATIONS,
    WEATHER,
    _client,
    chat_export,
    variant_url,
)
from tests.apps.serving.test_http import _slowed
from tests.chat.checkpoint import TEMPLATES
from tests.chat.schemas import SCHEMAS
from transformer_kit.apps.serving.http import create_app
from transformer_kit.apps.serving.http import serve_in_thread as running
from transformer_kit.runtime import Engine

#: get_weather in the Responses API's shape of a function tool.
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


def _chat(url: str, messages: list[dict], new: int, **options):
    """The greedy reply's message from /v1/chat/completions."""
    reply = _client(url).chat.completions.create(model="chat", messages=messages, max_tokens=new,
                                                 temperature=0, **options)
    return reply.choices[0].message


@pytest.mark.parametrize("case", ["text", "multi-turn", "instructions-and-parts"])
def test_a_greedy_response_equals_chat_completions(server, case):
    url, prompts = server
    client = _client(url)
    if case == "text":
        given, instructions, messages = "What is the weather in Paris?", None, CONVERSATIONS[0]
    elif case == "multi-turn":
        given, instructions, messages = CONVERSATIONS[1], None, CONVERSATIONS[1]
    else:
        parts = [{"type": "input_text", "text": "Two"}, {"type": "input_text", "text": "parts"}]
        given = [{"type": "message", "role": "user", "content": parts}]
        instructions, messages = "You are terse.", CONVERSATIONS[2]
    response = client.responses.create(model="chat", input=given, instructions=instructions,
                                       max_output_tokens=24, temperature=0)
    prompt = prompts[-1]
    chat = _client(url).chat.completions.create(model="chat", messages=messages, max_tokens=24,
                                                temperature=0)
    assert prompts[-1] == prompt  # the same rendered conversation
    assert response.output_text == chat.choices[0].message.content
    assert response.object == "response" and response.id.startswith("resp_")
    assert [item.type for item in response.output] == ["message"]
    assert response.output[0].role == "assistant" and response.output[0].content[0].type == "output_text"
    usage = response.usage
    assert (usage.input_tokens, usage.output_tokens) == (chat.usage.prompt_tokens,
                                                         chat.usage.completion_tokens)
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    cut = chat.choices[0].finish_reason == "length"
    assert response.status == ("incomplete" if cut else "completed")
    assert (response.incomplete_details is not None) == cut
    assert response.model == "chat" and response.instructions == instructions


TEXT_EVENTS = ["response.created", "response.in_progress", "response.output_item.added",
               "response.content_part.added"]
TEXT_END = ["response.output_text.done", "response.content_part.done", "response.output_item.done"]


def test_a_stream_sends_the_events_in_order_and_joins_to_the_reply(server):
    url, _ = server
    client = _client(url)
    for new in (40, 3):  # the second is cut: it ends with response.incomplete
        whole = client.responses.create(model="chat", input=CONVERSATIONS[1], max_output_tokens=new,
                                        temperature=0)
        events = list(client.responses.create(model="chat", input=CONVERSATIONS[1],
                                              max_output_tokens=new, temperature=0, stream=True))
        kinds = [e.type for e in events]
        deltas = [e for e in events if e.type == "response.output_text.delta"]
        end = "response.completed" if whole.status == "completed" else "response.incomplete"
        assert kinds == [*TEXT_EVENTS, *["response.output_text.delta"] * len(deltas), *TEXT_END, end]
        assert [e.sequence_number for e in events] == list(range(len(events)))
        text = "".join(d.delta for d in deltas)
        assert text == whole.output_text == events[-4].text == events[-3].part.text
        assert deltas and all(d.item_id == events[2].item.id for d in deltas)  # as many as arrivals
        final = events[-1].response
        assert final.output_text == text and final.usage == whole.usage and final.status == whole.status
        assert final.id == events[0].response.id and events[0].response.status == "in_progress"
        assert events[-2].item == final.output[0]
    assert whole.status == "incomplete" and whole.incomplete_details.reason == "max_output_tokens"
    assert whole.usage.output_tokens == 3


@pytest.mark.parametrize("name", ["flat", "nested", "array_of_objects", "recipe"])
def test_a_json_schema_reply_parses_and_validates(server, name):
    url, _ = server
    fmt = {"type": "json_schema", "name": name, "schema": SCHEMAS[name], "strict": True}
    response = _client(url).responses.create(model="chat", input=CONVERSATIONS[0], max_output_tokens=64,
                                             temperature=0, text={"format": fmt})
    jsonschema.validate(json.loads(response.output_text), SCHEMAS[name])
    assert response.text.format.type == "json_schema"
    chat = _chat(url, CONVERSATIONS[0], 64, response_format={"type": "json_schema", "json_schema": {
        "name": name, "schema": SCHEMAS[name], "strict": True}})
    assert response.output_text == chat.content


def test_a_forced_function_call_goes_round_trip(server):
    url, prompts = server
    client, question = _client(url), "What is the weather in Paris?"
    forced = {"type": "function", "name": "get_weather"}
    first = client.responses.create(model="chat", input=question, tools=[TOOL], tool_choice=forced,
                                    max_output_tokens=64, temperature=0)
    assert [item.type for item in first.output] == ["function_call"]
    call = first.output[0]
    assert call.name == "get_weather" and set(json.loads(call.arguments)) == {"city"}
    assert call.call_id and call.id.startswith("fc_") and call.status == "completed"
    chat = _chat(url, CONVERSATIONS[0], 64, tools=[WEATHER],
                 tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert chat.tool_calls[0].function.arguments == call.arguments

    events = list(client.responses.create(model="chat", input=question, tools=[TOOL], tool_choice=forced,
                                          max_output_tokens=64, temperature=0, stream=True))
    assert [e.type for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done", "response.completed"]
    assert events[2].item.arguments == "" and events[3].delta == events[4].arguments == call.arguments
    assert events[5].item.name == "get_weather" and events[-1].response.output[0].arguments == call.arguments
    with client.responses.stream(model="chat", input=question, tools=[TOOL], tool_choice=forced,
                                 max_output_tokens=64, temperature=0) as helper:  # checks the events
        assert helper.get_final_response().output[0].arguments == call.arguments

    answer = '{"sky": "sunny", "degrees": 21}'
    items = [{"role": "user", "content": question}, call.model_dump(exclude_none=True),
             {"type": "function_call_output", "call_id": call.call_id, "output": answer}]
    second = client.responses.create(model="chat", input=items, tools=[TOOL], max_output_tokens=16,
                                     temperature=0)
    prompt = prompts[-1]
    messages = [*CONVERSATIONS[0], {"role": "assistant", "content": None, "tool_calls": [
        {"id": call.call_id, "type": "function",
         "function": {"name": "get_weather", "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": answer}]
    reference = _chat(url, messages, 16, tools=[WEATHER])
    assert prompts[-1] == prompt  # the items render as chat's tool call and tool message
    assert second.output_text == (reference.content or "")
    held = list(client.responses.create(model="chat", input=items, tools=[TOOL], max_output_tokens=16,
                                        temperature=0, stream=True))  # tools: the text comes at the end
    kinds = [e.type for e in held]
    assert kinds == [*TEXT_EVENTS, *["response.output_text.delta"] * bool(second.output_text), *TEXT_END,
                     f"response.{second.status}"]
    assert "".join(e.delta for e in held if e.type == "response.output_text.delta") == second.output_text
    # the same turn, continuing the stored response instead of sending the call back
    continued = client.responses.create(model="chat", previous_response_id=first.id, tools=[TOOL],
                                        input=[items[2]], max_output_tokens=16, temperature=0)
    assert prompts[-1] == prompt and continued.output_text == second.output_text


def test_a_template_without_tools_answers_a_forced_function_call(variant_url, chat_export):  # noqa: F811
    """SmolLM2's template never reads tools: the kit gives them (docs/chat.md), and the forced
    call comes as a function_call item, ``OnnxModel.chat``'s call with that template, whole and
    streamed."""
    _, om = chat_export
    smollm = (TEMPLATES / "HuggingFaceTB--SmolLM2-135M-Instruct.jinja").read_text(encoding="utf-8")
    question = "What is the weather in Paris?"
    forced = {"type": "function", "name": "get_weather"}
    expected = om.chat([{"role": "user", "content": question}], tools=[WEATHER], chat_template=smollm,
                       tool_choice={"type": "function", "function": {"name": "get_weather"}},
                       max_new_tokens=64)["tool_calls"][0]["function"]
    engine, serving = variant_url("smollm-responses", smollm)
    with serving as url:
        client = _client(url)
        whole = client.responses.create(model="chat", input=question, tools=[TOOL], tool_choice=forced,
                                        max_output_tokens=64, temperature=0)
        assert [item.type for item in whole.output] == ["function_call"] and whole.status == "completed"
        call = whole.output[0]
        assert (call.name, call.arguments) == (expected["name"], expected["arguments"])
        jsonschema.validate(json.loads(call.arguments), WEATHER["function"]["parameters"])
        events = list(client.responses.create(model="chat", input=question, tools=[TOOL],
                                              tool_choice=forced, max_output_tokens=64, temperature=0,
                                              stream=True))
        assert [e.type for e in events][2:] == [
            "response.output_item.added", "response.function_call_arguments.delta",
            "response.function_call_arguments.done", "response.output_item.done", "response.completed"]
        assert events[-1].response.output[0].arguments == call.arguments
    engine.close()


def test_previous_response_id_continues_a_conversation(server):
    url, prompts = server
    client = _client(url)
    first = client.responses.create(model="chat", input="Hello there", instructions="Answer in a few words.",
                                    max_output_tokens=12, temperature=0)
    second = client.responses.create(model="chat", previous_response_id=first.id,
                                     instructions="Answer in a few words.",
                                     input="Tell me about café culture.", max_output_tokens=16, temperature=0)
    assert second.previous_response_id == first.id
    prompt = prompts[-1]
    messages = [{"role": "system", "content": "Answer in a few words."},
                {"role": "user", "content": "Hello there"},
                {"role": "assistant", "content": first.output_text},
                {"role": "user", "content": "Tell me about café culture."}]
    assert second.output_text == _chat(url, messages, 16).content
    assert prompts[-1] == prompt
    streamed = list(client.responses.create(model="chat", previous_response_id=second.id, input="And tea?",
                                            max_output_tokens=8, temperature=0, stream=True))
    third = streamed[-1].response  # instructions are not carried over (OpenAI's rule)
    expected = _chat(url, [*messages[1:], {"role": "assistant", "content": second.output_text},
                           {"role": "user", "content": "And tea?"}], 8)
    assert third.output_text == expected.content
    unstored = client.responses.create(model="chat", input="Hi", max_output_tokens=2, temperature=0,
                                       store=False)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError, match="is not a response this server holds"):
        client.responses.create(model="chat", previous_response_id=unstored.id, input="Hi")
    # a streamed response is stored too
    after = client.responses.create(model="chat", previous_response_id=third.id, input="ok",
                                    max_output_tokens=2, temperature=0)
    assert after.status in ("completed", "incomplete")


def test_a_stored_response_is_read_again_and_deleted(server):
    url, _ = server
    client = _client(url)
    whole = client.responses.create(model="chat", input="Hello there", max_output_tokens=6, temperature=0)
    streamed = list(client.responses.create(model="chat", input="Tell me about tea.", max_output_tokens=6,
                                            temperature=0, stream=True))[-1].response
    for answered in (whole, streamed):
        again = client.responses.retrieve(answered.id)
        assert again.model_dump() == answered.model_dump()
        assert again.output_text == answered.output_text != ""
    client.responses.delete(whole.id)
    for call in (lambda: client.responses.retrieve(whole.id), lambda: client.responses.delete(whole.id)):
        with pytest.raises(openai.NotFoundError, match="is not a response this server holds") as gone:
            call()
        assert gone.value.body["param"] == "response_id"
    with pytest.raises(openai.NotFoundError, match="previous_response_id"):
        client.responses.create(model="chat", previous_response_id=whole.id, input="Again")
    assert client.responses.retrieve(streamed.id).id == streamed.id  # the other one is kept
    unstored = client.responses.create(model="chat", input="Hi", max_output_tokens=2, temperature=0,
                                       store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)
    answer = httpx.delete(f"{url}/v1/responses/{streamed.id}")
    assert answer.status_code == 200
    assert answer.json() == {"id": streamed.id, "object": "response", "deleted": True}


def test_the_store_keeps_the_last_n_and_the_key_is_checked(chat_export):  # noqa: F811
    _, om = chat_export
    engine = Engine(om, max_batch=2)
    with running(create_app(engine, "chat", api_key="k", stored_responses=2)) as url:
        assert httpx.post(f"{url}/v1/responses", json={"model": "chat", "input": "Hi"}).status_code == 401
        assert httpx.get(f"{url}/v1/responses/resp_1").status_code == 401
        assert httpx.delete(f"{url}/v1/responses/resp_1").status_code == 401
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0, timeout=60)
        ids = [client.responses.create(model="chat", input=f"Hi {i}", max_output_tokens=2,
                                       temperature=0).id for i in range(3)]
        with pytest.raises(openai.NotFoundError, match="keeps the last 2 responses") as refused:
            client.responses.create(model="chat", previous_response_id=ids[0], input="Again")
        assert refused.value.body["param"] == "previous_response_id"
        def again(ident: str, store: bool) -> str:
            return client.responses.create(model="chat", previous_response_id=ident, input="Again",
                                           max_output_tokens=2, temperature=0, store=store).id

        again(ids[2], False), again(ids[1], False)  # both held; ids[1] now the most recently used
        newest = again(ids[1], True)  # a third stored response: ids[2], least recently used, goes
        with pytest.raises(openai.NotFoundError):
            again(ids[2], False)
        again(ids[1], False), again(newest, False)
    engine.close()


def test_the_limits_and_failures_are_the_other_endpoints(server, chat_export):  # noqa: F811
    url, prompts = server
    _client(url).responses.create(model="chat", input=CONVERSATIONS[1], max_output_tokens=1)
    rendered = len(prompts[-1])
    _, om = chat_export
    engine = _slowed(Engine(om, max_batch=4), 0.05)  # 200 tokens: 10 s
    app = create_app(engine, "chat", max_prompt_tokens=rendered - 1, max_request_seconds=1.0)
    with running(app) as bounded:
        client = _client(bounded)
        with pytest.raises(openai.BadRequestError) as over:
            client.responses.create(model="chat", input=CONVERSATIONS[1], max_output_tokens=2)
        assert over.value.code == "context_length_exceeded"
        slow = {"model": "chat", "input": "Hi", "max_output_tokens": 200, "temperature": 0}
        with pytest.raises(openai.InternalServerError) as late:
            client.responses.create(**slow)
        assert late.value.status_code == 504 and late.value.code == "request_timeout"
        with pytest.raises(openai.APIError, match="limit of 1 s") as cut:
            for _ in client.responses.create(**slow, stream=True):
                pass
        assert cut.value.code == "request_timeout"
        assert engine.stats.finished["timeout"] == 2 and engine.stats.batch_size == 0
    engine.close()
    engine = _slowed(Engine(om, max_batch=2), 0.02)  # 200 tokens: 4 s
    with running(create_app(engine, "chat")) as url:
        with httpx.stream("POST", f"{url}/v1/responses", json={**slow, "stream": True}) as response:
            assert next(response.iter_lines()) == "event: response.created"  # then the client leaves
        deadline = time.monotonic() + 10
        while engine.stats.finished.get("cancelled", 0) == 0:
            assert time.monotonic() < deadline, engine.stats
            time.sleep(0.02)
        assert engine.stats.batch_size == 0
    engine.close()


def _refused(url: str, body: dict, *words: str) -> None:
    response = httpx.post(f"{url}/v1/responses", json={"model": "chat", **body}, timeout=60)
    assert response.status_code == 400, response.text
    message = response.json()["error"]["message"]
    assert message.endswith(".") and all(w in message for w in words), message


def test_bad_requests_get_400_with_a_sentence_and_the_server_keeps_serving(server):
    url, _ = server
    _refused(url, {"input": "Hi", "logit_bias": {"5": 1}}, "Unknown field 'logit_bias'",
             "/v1/responses takes", "instructions")
    _refused(url, {"input": "Hi", "reasoning": {"effort": "low"}}, "reasoning.effort is 'low'",
             "no reasoning_effort switch")
    _refused(url, {"input": "Hi", "text": {"format": {"type": "text"}, "verbosity": "low"}},
             "text.verbosity is 'low'")
    _refused(url, {"input": "Hi", "text": {"format": {"type": "text"}, "tone": "dry"}}, "'text.tone'")
    _refused(url, {"input": []}, "input is empty")
    _refused(url, {"input": [{"type": "reasoning", "summary": []}]}, "input[0]", "'reasoning'",
             "function_call_output")
    _refused(url, {"input": [{"role": "robot", "content": "hi"}]}, "'robot'", "user")
    _refused(url, {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
             "input[0].content[0]", "'input_image'", "text only")
    _refused(url, {"input": [{"type": "function_call_output", "output": "x"}]}, "'call_id'")
    _refused(url, {"input": "Hi", "tools": [{"type": "web_search"}]}, "tools[0]", "'web_search'",
             "function tools only")
    _refused(url, {"input": "Hi", "tool_choice": {"type": "file_search"}}, "tool_choice", "'required'")
    _refused(url, {"input": "Hi", "tool_choice": "sometimes", "tools": [TOOL]}, "'sometimes'", "'name'")
    _refused(url, {"input": ["Hi", "there"]}, "input[0] is a str", "list of items")
    _refused(url, {"input": "Hi", "tool_choice": "required"}, "needs tools")
    _refused(url, {"input": "Hi", "max_output_tokens": 4000}, "context length")
    _refused(url, {"input": "Hi", "text": {"format": {"type": "json_schema", "name": "x",
                                                      "schema": {"type": "frob"}}}}, "frob")
    _refused(url, {"input": "Hi", "temperature": 3}, "'temperature'")
    missing = httpx.post(f"{url}/v1/responses", json={"model": "chat", "input": "Hi",
                                                      "previous_response_id": "resp_nope"})
    assert missing.status_code == 404 and "'resp_nope'" in missing.json()["error"]["message"]
    with pytest.raises(openai.NotFoundError):
        _client(url).responses.create(model="other", input="Hi", max_output_tokens=2)
    good = _client(url).responses.create(model="chat", input="Hi", max_output_tokens=3, temperature=0)
    assert good.usage.output_tokens >= 1
