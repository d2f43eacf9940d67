"""``POST /v1/chat/completions`` on 127.0.0.1 with the official ``openai`` client, over the chat
checkpoint of tests/chat/checkpoint.py (a random Qwen2, ChatML, the Qwen2.5 template): greedy
replies equal ``OnnxModel.chat`` and transformers' ``generate``; streams join to the reply;
concurrent clients each get their sequential answer; structured output parses and validates;
a tool call goes round trip with the prompt transformers renders, on a template that renders no
tools too; bad requests get 400 with a sentence and the server keeps serving."""

from __future__ import annotations

import json
import re
import shutil
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema
import openai
import pytest
import torch
import transformers as hf

import transformer_kit as tk
from tests.apps.serving.conftest import record_prompts
from tests.apps.serving.test_http import _slowed
from tests.chat.checkpoint import TEMPLATES, write_chat_checkpoint
from tests.chat.schemas import DOZEN_SCHEMA, LENIENT_SCHEMAS, SCHEMAS, json_schema_format
from tests.chat.test_tool_prompt import documented_text
from transformer_kit.apps.serving.chat import ChatMessage
from transformer_kit.apps.serving.http import create_app
from transformer_kit.apps.serving.http import serve_in_thread as running
from transformer_kit.export import export_onnx
from transformer_kit.runtime import Engine, OnnxModel
from transformer_kit.runtime.service import template_messages

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}},
                   "required": ["city"]}}}
CONVERSATIONS = [
    [{"role": "user", "content": "What is the weather in Paris?"}],
    [{"role": "system", "content": "Answer in a few words."},
     {"role": "user", "content": "Hello there"},
     {"role": "assistant", "content": "Hi! How can I help?"},
     {"role": "user", "content": "Tell me about café culture."}],
    [{"role": "developer", "content": "You are terse."},
     {"role": "user", "content": [{"type": "text", "text": "Two"}, {"type": "text", "text": "parts"}]}],
]


@pytest.fixture(scope="module")
def chat_export(tmp_path_factory):
    """(checkpoint folder, its export in onnxruntime)."""
    folder = write_chat_checkpoint(tmp_path_factory.mktemp("serving-chat") / "qwen2")
    export_onnx(tk.from_hf(folder), folder / "onnx")
    return folder, OnnxModel(folder / "onnx", providers="cpu")


@pytest.fixture(scope="module")
def reference(chat_export):
    """transformers' model and tokenizer of the same checkpoint."""
    folder, _ = chat_export
    return hf.AutoModelForCausalLM.from_pretrained(folder).eval(), hf.AutoTokenizer.from_pretrained(folder)


@pytest.fixture(scope="module")
def server(chat_export):
    """(base URL, the prompts the engine was given, in order)."""
    _, om = chat_export
    engine = Engine(om, max_batch=16, max_queue=64)
    prompts = record_prompts(engine)
    with running(create_app(engine, "chat")) as url:
        yield url, prompts
    engine.close()


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=120)


def _plain(messages: list[dict]) -> list[dict]:
    """What a template reads (developer as system, parts joined), for the references."""
    return template_messages([ChatMessage(**m).model_dump(exclude_none=True) for m in messages])


def _encoded(om: OnnxModel, text: str) -> list[int]:
    """The export's ids of ``text`` (transformers 5 loads this checkpoint's tokenizer as Qwen2's,
    whose pre-tokenizer splits digits apart; tokenizer.json, which the kit keeps, does not)."""
    return om.tokenizer.encode([text], add_special_tokens=False)[0][0].tolist()


def _transformers_reply(reference, messages: list[dict], new: int, tools=None) -> str:
    """transformers' greedy reply: new tokens up to the first end id, special tokens skipped."""
    model, tokenizer = reference
    prompt = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    inputs = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=new, do_sample=False)
    tokens = out[0, inputs["input_ids"].shape[1]:].tolist()
    ends = [i for i, t in enumerate(tokens) if t in model.generation_config.eos_token_id]
    return tokenizer.decode(tokens[:ends[0]] if ends else tokens, skip_special_tokens=True)


@pytest.mark.parametrize("messages", CONVERSATIONS, ids=["one-turn", "multi-turn", "developer-parts"])
def test_a_greedy_reply_equals_chat_and_transformers(server, chat_export, reference, messages):
    url, _ = server
    _, om = chat_export
    completion = _client(url).chat.completions.create(model="chat", messages=messages, max_tokens=24,
                                                      temperature=0)
    choice = completion.choices[0]
    expected = _transformers_reply(reference, _plain(messages), 24)
    assert choice.message.content == om.chat(_plain(messages), max_new_tokens=24)["content"] == expected
    assert choice.message.role == "assistant" and choice.message.tool_calls is None
    assert completion.object == "chat.completion" and completion.id.startswith("chatcmpl-")
    prompt = reference[1].apply_chat_template(_plain(messages), tokenize=False, add_generation_prompt=True)
    prompt_tokens = len(_encoded(om, prompt))
    usage = completion.usage
    assert usage.prompt_tokens == prompt_tokens
    assert usage.total_tokens == prompt_tokens + usage.completion_tokens
    assert choice.finish_reason == ("length" if usage.completion_tokens == 24 else "stop")


def test_a_stream_joins_to_the_reply_and_ends_with_usage(server):
    url, _ = server
    client, messages = _client(url), CONVERSATIONS[1]
    whole = client.chat.completions.create(model="chat", messages=messages, max_tokens=20, temperature=0)
    chunks = list(client.chat.completions.create(model="chat", messages=messages, max_tokens=20,
                                                 temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content == ""
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks[:-1]][-1] == whole.choices[0].finish_reason
    assert not any(c.choices[0].finish_reason for c in chunks[:-2])
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    assert all(c.usage is None for c in chunks[:-1])
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    plain = list(client.chat.completions.create(model="chat", messages=messages, max_tokens=20,
                                                temperature=0, stream=True))
    assert all(c.choices for c in plain)  # no usage chunk unless asked


def test_stop_strings_cut_the_reply_as_openai_does(server):
    url, _ = server
    client, messages = _client(url), CONVERSATIONS[0]
    full = client.chat.completions.create(model="chat", messages=messages, max_tokens=24,
                                          temperature=0).choices[0].message.content
    stop = full[5:8]
    cut = client.chat.completions.create(model="chat", messages=messages, max_tokens=24, temperature=0,
                                         stop=[stop])
    assert cut.choices[0].message.content == full[:full.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    streamed = client.chat.completions.create(model="chat", messages=messages, max_tokens=24,
                                              temperature=0, stop=stop, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == full[:full.index(stop)]


def test_concurrent_clients_each_get_their_sequential_answer(server):
    url, _ = server
    cases = [([{"role": "user", "content": f"Question {i}: " + "weather in Paris? " * (i % 5)}], 4 + i)
             for i in range(16)]

    def ask(case):
        messages, new = case
        reply = _client(url).chat.completions.create(model="chat", messages=messages, max_tokens=new,
                                                     temperature=0)
        return reply.choices[0].message.content, reply.usage.completion_tokens

    sequential = [ask(case) for case in cases]
    with ThreadPoolExecutor(16) as pool:
        assert list(pool.map(ask, cases)) == sequential
    assert len({text for text, _ in sequential}) > 8  # different conversations, different answers


@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 1.0, "seed": 5}],
                         ids=["greedy", "sampled"])
@pytest.mark.parametrize("name", list(SCHEMAS))
def test_every_json_schema_reply_parses_and_validates(server, name, sampling):
    """The twenty schemas of tests/chat/schemas.py, each request with its own matcher."""
    url, _ = server
    reply = _client(url).chat.completions.create(model="chat", messages=CONVERSATIONS[0], max_tokens=48,
                                                 response_format=json_schema_format(name), **sampling)
    jsonschema.validate(json.loads(reply.choices[0].message.content), SCHEMAS[name])


def test_a_choice_list_holds(server):
    url, _ = server
    choices = ["yes", "no", "maybe"]
    for seed in range(3):
        reply = _client(url).chat.completions.create(
            model="chat", messages=CONVERSATIONS[0], max_tokens=8, temperature=1.0, seed=seed,
            extra_body={"response_format": {"type": "choice", "choices": choices}})
        assert reply.choices[0].message.content in choices


def test_json_object_and_regex_formats_hold(server):
    url, _ = server
    client = _client(url)
    replies = [client.chat.completions.create(model="chat", messages=CONVERSATIONS[0], max_tokens=48,
                                              temperature=1.0, seed=2,
                                              response_format={"type": "json_object"}) for _ in range(2)]
    assert replies[0].choices[0].finish_reason == "stop"
    answer = json.loads(replies[0].choices[0].message.content)
    assert isinstance(answer, dict) and answer  # a non-empty object (this seed's)
    assert replies[1].choices[0].message.content == replies[0].choices[0].message.content  # seeded
    pattern = r"(sunny|rain), [0-9]{1,2} degrees"
    for stream in (False, True):
        reply = client.chat.completions.create(model="chat", messages=CONVERSATIONS[0], max_tokens=24,
                                               temperature=0, stream=stream,
                                               extra_body={"response_format": {"type": "regex",
                                                                               "regex": pattern}})
        text = ("".join(c.choices[0].delta.content or "" for c in reply) if stream
                else reply.choices[0].message.content)
        assert re.fullmatch(pattern, text), text


def test_a_tool_call_goes_round_trip_with_transformers_prompt(server, chat_export, reference):
    url, prompts = server
    (_, om), client, tokenizer = chat_export, _client(url), reference[1]
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = client.chat.completions.create(model="chat", messages=messages, tools=[WEATHER],
                                           tool_choice="required", max_tokens=64, temperature=0)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather"
    assert set(json.loads(call.function.arguments)) == {"city"}

    streamed = list(client.chat.completions.create(model="chat", messages=messages, tools=[WEATHER],
                                                   tool_choice="required", max_tokens=64, temperature=0,
                                                   stream=True))
    deltas = [c.choices[0].delta.tool_calls for c in streamed if c.choices[0].delta.tool_calls]
    assert len(deltas) == 1 and deltas[0][0].index == 0
    function = deltas[0][0].function
    assert (function.name, function.arguments) == ("get_weather", call.function.arguments)
    assert streamed[-1].choices[0].finish_reason == "tool_calls"

    answer = {"role": "tool", "tool_call_id": call.id, "content": '{"sky": "sunny", "degrees": 21}'}
    second = client.chat.completions.create(model="chat", messages=[*messages, choice.message, answer],
                                            tools=[WEATHER], max_tokens=16, temperature=0)
    assert isinstance(second.choices[0].message.content, str)
    assert second.choices[0].finish_reason in ("stop", "length")
    # the prompt of the second request: transformers' rendering with the arguments as an object
    # (as the model was trained); OpenAI's JSON string would be written as a quoted string
    sent = {"role": "assistant", "content": None, "tool_calls": [
        {"id": call.id, "type": "function",
         "function": {"name": "get_weather", "arguments": json.loads(call.function.arguments)}}]}
    expected = tokenizer.apply_chat_template([*messages, sent, answer], tools=[WEATHER], tokenize=False,
                                             add_generation_prompt=True)
    assert prompts[-1] == _encoded(om, expected)
    as_string = [*messages, {**sent, "tool_calls": [call.model_dump()]}, answer]
    assert tokenizer.apply_chat_template(as_string, tools=[WEATHER], tokenize=False,
                                         add_generation_prompt=True) != expected


@pytest.fixture(scope="module")
def variant_url(chat_export):
    """Serve a copy of the export whose chat template is ``template`` (None: none at all)."""
    folder, _ = chat_export

    def serve(name: str, template: str | None):
        copy = folder.parent / name
        shutil.copytree(folder / "onnx", copy)
        (copy / "chat_template.jinja").unlink()
        if template is not None:
            (copy / "chat_template.jinja").write_text(template, encoding="utf-8")
        engine = Engine(OnnxModel(copy, providers="cpu"), max_batch=2)
        return engine, running(create_app(engine, "chat"))

    return serve


def _refused(url: str, body: dict, *words: str) -> None:
    response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 400, response.text
    message = response.json()["error"]["message"]
    assert message.endswith(".") and all(w in message for w in words), message


def test_bad_requests_get_400_with_a_sentence_and_the_server_keeps_serving(server):
    url, _ = server
    messages = CONVERSATIONS[0]
    _refused(url, {"model": "chat", "messages": []}, "messages is empty")
    _refused(url, {"model": "chat", "messages": [{"role": "robot", "content": "hi"}]}, "'robot'", "user")
    _refused(url, {"model": "chat", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
             "'image_url'", "text only")
    _refused(url, {"model": "chat", "messages": messages, "n": 0}, "'n'", "greater than or equal to 1")
    _refused(url, {"model": "chat", "messages": messages, "modalities": ["audio"]}, "'modalities'",
             "messages")
    _refused(url, {"model": "chat", "messages": messages, "stream_options": {"include_usage": True}},
             "stream=true")
    _refused(url, {"model": "chat", "messages": messages, "max_tokens": 4000}, "context length")
    _refused(url, {"model": "chat", "messages": messages, "tool_choice": "required"}, "needs tools")
    _refused(url, {"model": "chat", "messages": messages, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "frob"}}}}, "frob")
    with pytest.raises(openai.NotFoundError):
        _client(url).chat.completions.create(model="other", messages=messages, max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="Unknown field 'temperatur'"):
        _client(url).chat.completions.create(model="chat", messages=messages,
                                             extra_body={"temperatur": 0.5})
    good = _client(url).chat.completions.create(model="chat", messages=messages, max_tokens=3, temperature=0)
    assert good.usage.completion_tokens >= 1


def test_exports_that_cannot_chat_are_refused(variant_url, onnx_model):
    messages = CONVERSATIONS[0]
    engine, serving = variant_url("no-template", None)
    with serving as url:
        _refused(url, {"model": "chat", "messages": messages}, "no chat template")
    engine.close()
    engine = Engine(onnx_model, max_batch=2)
    with running(create_app(engine, "tiny")) as url:
        _refused(url, {"model": "tiny", "messages": messages}, "no tokenizer")
    engine.close()


def test_a_template_without_tools_answers_a_forced_call(variant_url, chat_export, reference):
    """SmolLM2's template never reads tools: the engine is given transformers' rendering of the
    conversation with the tools' text of docs/chat.md as its system message; the forced call is
    ``OnnxModel.chat``'s with that template, its arguments valid, streamed as whole; ``none``
    ignores the tools, ``auto`` answers a call or text; bad tools get 400 with a sentence."""
    (_, om), tokenizer = chat_export, reference[1]
    smollm = (TEMPLATES / "HuggingFaceTB--SmolLM2-135M-Instruct.jinja").read_text(encoding="utf-8")
    messages = CONVERSATIONS[0]
    engine, serving = variant_url("smollm", smollm)
    prompts = record_prompts(engine)
    named = {"type": "function", "function": {"name": "get_weather"}}
    with serving as url:
        client = _client(url)
        for choice, closing in (("required", "Answer now with a call to one of the tools."),
                                (named, "Answer now with a call to the tool get_weather.")):
            whole = client.chat.completions.create(model="chat", messages=messages, tools=[WEATHER],
                                                   tool_choice=choice, max_tokens=64, temperature=0)
            system = [{"role": "system", "content": documented_text([WEATHER], closing)}, *messages]
            expected = tokenizer.apply_chat_template(system, chat_template=smollm, tokenize=False,
                                                     add_generation_prompt=True)
            assert prompts[-1] == _encoded(om, expected) and whole.usage.prompt_tokens == len(prompts[-1])
            choice_ = whole.choices[0]
            assert choice_.finish_reason == "tool_calls" and choice_.message.content is None
            (call,) = choice_.message.tool_calls
            chat = om.chat(messages, tools=[WEATHER], tool_choice=choice, chat_template=smollm,
                           max_new_tokens=64)["tool_calls"][0]["function"]
            assert (call.function.name, call.function.arguments) == (chat["name"], chat["arguments"])
            jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
            streamed = list(client.chat.completions.create(
                model="chat", messages=messages, tools=[WEATHER], tool_choice=choice, max_tokens=64,
                temperature=0, stream=True))
            deltas = [c.choices[0].delta.tool_calls for c in streamed if c.choices[0].delta.tool_calls]
            assert len(deltas) == 1 and deltas[0][0].index == 0
            assert (deltas[0][0].function.name, deltas[0][0].function.arguments) == (
                call.function.name, call.function.arguments)
            assert streamed[-1].choices[0].finish_reason == "tool_calls"

        auto = client.chat.completions.create(model="chat", messages=messages, tools=[WEATHER],
                                              max_tokens=24, temperature=0).choices[0]
        said = om.chat(messages, tools=[WEATHER], chat_template=smollm, max_new_tokens=24)
        assert auto.message.content == said["content"] and auto.finish_reason == said["finish_reason"]
        none = client.chat.completions.create(model="chat", messages=messages, tools=[WEATHER],
                                              tool_choice="none", max_tokens=4, temperature=0)
        assert none.choices[0].message.tool_calls is None  # tools left out of the turn: accepted
        plain = client.chat.completions.create(model="chat", messages=messages, max_tokens=4, temperature=0)
        assert none.choices[0].message.content == plain.choices[0].message.content

        body = {"model": "chat", "messages": messages, "tool_choice": "required"}
        _refused(url, {**body, "tools": [{"type": "function", "function": {"description": "x"}}]},
                 "tools[0]", "no name")
        _refused(url, {**body, "tools": [{"type": "function",
                                          "function": {"name": "f", "parameters": "city"}}]},
                 "tools[0] (f)", "no JSON schema")
        _refused(url, {**body, "tools": [{"type": "function", "function": {
            "name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "frob"}}}}}]},
            "The parameters of the tool 'f'", "Invalid type: frob")
        _refused(url, {**body, "tools": [WEATHER],
                       "tool_choice": {"type": "function", "function": {"name": "nope"}}},
                 "'nope'", "not among the tools", "get_weather")
        assert client.chat.completions.create(model="chat", messages=messages, max_tokens=2).usage
    engine.close()


def test_a_client_that_leaves_a_stream_cancels_it_and_failures_keep_the_server_up(chat_export):
    _, om = chat_export
    engine = _slowed(Engine(om, max_batch=2), 0.02)  # 200 tokens: 4 s
    body = {"model": "chat", "messages": CONVERSATIONS[0], "max_tokens": 200, "temperature": 0}
    with running(create_app(engine, "chat")) as url:
        with httpx.stream("POST", f"{url}/v1/chat/completions", json={**body, "stream": True}) as response:
            assert next(response.iter_lines()).startswith("data: ")  # the role came; the client leaves
        deadline = time.monotonic() + 10
        while engine.stats.finished.get("cancelled", 0) == 0:
            assert time.monotonic() < deadline, engine.stats
            time.sleep(0.02)

        def failing(tokens):
            raise RuntimeError("a broken step")

        engine.generation.decoder.step = failing  # the engine replaces its batch after a failure
        broken = httpx.post(f"{url}/v1/chat/completions", json={**body, "max_tokens": 4}, timeout=60)
        assert broken.status_code == 500 and "a broken step" in broken.json()["error"]["message"]
        good = httpx.post(f"{url}/v1/chat/completions", json={**body, "max_tokens": 2}, timeout=60)
        assert good.status_code == 200 and good.json()["usage"]["completion_tokens"] == 2
    engine.close()
    engine = Engine(om, max_batch=1, max_queue=1, start=False)
    with running(create_app(engine, "chat")) as url:
        waiting = engine.submit([1, 2], max_new_tokens=2)  # fills the queue: the loop is not started
        full = httpx.post(f"{url}/v1/chat/completions", json={**body, "max_tokens": 2}, timeout=60)
        assert full.status_code == 503 and "max_queue" in full.json()["error"]["message"]
        engine.start()
        assert waiting.result()
        assert httpx.post(f"{url}/v1/chat/completions", json={**body, "max_tokens": 2}).status_code == 200
    engine.close()


def test_a_long_conversation_gets_400_and_a_reply_past_its_time_an_error(server, chat_export):
    url, prompts = server
    short, long = CONVERSATIONS[0], CONVERSATIONS[1]
    expected = _client(url).chat.completions.create(model="chat", messages=short, max_tokens=3,
                                                    temperature=0)
    _client(url).chat.completions.create(model="chat", messages=long, max_tokens=1)
    rendered = len(prompts[-1])  # the long conversation's tokens, as the template renders it
    assert expected.usage.prompt_tokens < rendered - 1
    _, om = chat_export
    engine = _slowed(Engine(om, max_batch=4), 0.05)  # 200 tokens: 10 s
    app = create_app(engine, "chat", max_prompt_tokens=rendered - 1, max_request_seconds=1.0)
    with running(app) as bounded:
        client = _client(bounded)
        with pytest.raises(openai.BadRequestError) as over:
            client.chat.completions.create(model="chat", messages=long, max_tokens=2)
        assert over.value.code == "context_length_exceeded"
        assert f"rendered by the chat template, has {rendered} tokens" in str(over.value)
        assert f"the {rendered - 1} tokens this server takes" in str(over.value)
        slow = {"model": "chat", "messages": short, "max_tokens": 200, "temperature": 0}
        with pytest.raises(openai.InternalServerError) as late:
            client.chat.completions.create(**slow)
        assert late.value.status_code == 504 and late.value.code == "request_timeout"
        with pytest.raises(openai.APIError, match="limit of 1 s") as cut:
            for _ in client.chat.completions.create(**slow, stream=True):
                pass
        assert cut.value.code == "request_timeout"
        assert engine.stats.finished["timeout"] == 2 and engine.stats.batch_size == 0
        again = client.chat.completions.create(model="chat", messages=short, max_tokens=3, temperature=0)
        assert again.choices[0].message.content == expected.choices[0].message.content
        assert again.usage.completion_tokens == expected.usage.completion_tokens
    engine.close()


def test_lenient_schemas_and_a_dozen_keys_through_the_openai_client(server):
    """A format llguidance does not know compiles (lenient by default) and the reply validates;
    ``lenient: false`` is 400 with llguidance's sentence. A dozen required keys close within 100
    tokens ("stop"), and 40 tokens say "length", as ``OnnxModel.chat``."""
    url, _ = server
    messages = CONVERSATIONS[0]
    schema, _ = LENIENT_SCHEMAS["url_format"]
    fmt = {"type": "json_schema", "json_schema": {"name": "home", "schema": schema}}
    reply = _client(url).chat.completions.create(model="chat", messages=messages, max_tokens=40,
                                                 temperature=0, response_format=fmt)
    jsonschema.validate(json.loads(reply.choices[0].message.content), schema)
    _refused(url, {"model": "chat", "messages": messages, "response_format": {
        "type": "json_schema", "json_schema": {**fmt["json_schema"], "lenient": False}}},
        "Unknown format", "lenient=false")
    dozen = {"type": "json_schema", "json_schema": {"name": "order", "schema": DOZEN_SCHEMA}}
    for budget, reason in ((100, "stop"), (40, "length")):
        reply = _client(url).chat.completions.create(model="chat", messages=messages, max_tokens=budget,
                                                     temperature=0, response_format=dozen)
        assert reply.choices[0].finish_reason == reason
        if reason == "stop":
            jsonschema.validate(json.loads(reply.choices[0].message.content), DOZEN_SCHEMA)
