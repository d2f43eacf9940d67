"""Reasoning replies through ``transformer-kit serve`` with the openai client: Qwen3's real
template (``<think>``) and gpt-oss's (harmony channels) on random Qwen3 checkpoints whose greedy
reply is set to write the markup (tests/chat/reasoning_checkpoint.py). The split equals the
parse of ``/v1/completions``' raw text for the same greedy request, streams join to the whole
reply, thinking switches change the rendered prompt as the template says, and a switch the
template does not have is refused."""

from __future__ import annotations

import httpx
import openai
import pytest

import transformer_kit as tk
from tests.chat.reasoning_checkpoint import write_reasoning_checkpoint
from transformer_kit.apps.serving.http import create_app
from transformer_kit.apps.serving.http import serve_in_thread as running
from transformer_kit.chat.reasoning import split
from transformer_kit.export import export_onnx
from transformer_kit.runtime import Engine, OnnxModel

QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CHAINS = {
    "qwen3": ("qwen3", [["\n", "<think>", "The user asks", "</think>", " Paris is sunny", "<|im_end|>"],
                        ["\n\n", "Sunny", "<|im_end|>"]]),  # after the closed <think> of thinking off
    "analysis": ("harmony", [["assistant", "<|channel|>", "analysis", "<|message|>", "The user asks",
                              "<|end|>", "<|start|>", "assistant"]]),
    "call": ("harmony", [["assistant", " to=functions.get_weather", "<|channel|>", "commentary json",
                          "<|message|>", '{"city": "Paris"}', "<|call|>"]]),
}


@pytest.fixture(scope="module", params=sorted(CHAINS))
def served(request, tmp_path_factory):
    """(name, export, base URL) of a reasoning checkpoint's export behind the server."""
    kind, chain = CHAINS[request.param]
    folder = write_reasoning_checkpoint(tmp_path_factory.mktemp(request.param) / "model", kind, chain)
    export_onnx(tk.from_hf(folder), folder / "onnx")
    om = OnnxModel(folder / "onnx", providers="cpu")
    engine = Engine(om, max_batch=4, max_queue=16)
    with running(create_app(engine, "m")) as url:
        yield request.param, om, url
    engine.close()


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=120)


def _raw(om: OnnxModel, url: str, max_tokens: int, tools=None, **template_kwargs) -> str:
    """/v1/completions' greedy text of the prompt the chat template renders."""
    prompt = om.tokenizer.apply_chat_template(QUESTION, tools=tools, **template_kwargs)
    ids = om.tokenizer.encode([prompt], add_special_tokens=False)[0][0].tolist()
    out = _client(url).completions.create(model="m", prompt=ids, max_tokens=max_tokens, temperature=0)
    return out.choices[0].text


def test_the_split_is_the_parse_of_the_raw_text_and_streams_join_to_it(served):
    name, om, url = served
    tools = [WEATHER] if name == "call" else None
    client, new = _client(url), 24
    reply = client.chat.completions.create(model="m", messages=QUESTION, max_tokens=new, temperature=0,
                                           tools=tools)
    message = reply.choices[0].message
    raw = _raw(om, url, new, tools)
    fmt = "think" if name == "qwen3" else "harmony"
    expected = split(raw, fmt)
    if name == "qwen3":
        assert raw == "<think>The user asks</think> Paris is sunny"
        assert (message.reasoning_content, message.content) == ("The user asks", "Paris is sunny")
        assert reply.choices[0].finish_reason == "stop"
    elif name == "analysis":  # the model thinks in a loop until max_tokens
        assert raw.startswith("<|channel|>analysis<|message|>The user asks<|end|><|start|>assistant")
        assert message.reasoning_content.startswith("The user asks\nThe user asks\n")
        assert message.content == "" and reply.choices[0].finish_reason == "length"
    else:
        assert raw == ' to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}'
        assert message.reasoning_content is None and message.content is None
        [call] = message.tool_calls
        assert (call.function.name, call.function.arguments) == ("get_weather", '{"city": "Paris"}')
        assert reply.choices[0].finish_reason == "tool_calls"
        assert expected.calls == [("get_weather", '{"city": "Paris"}')]
    assert (message.reasoning_content, message.content or "") == (expected.reasoning, expected.content)
    assert message.model_extra["reasoning"] == message.reasoning_content  # vLLM's name too
    assert om.chat(QUESTION, max_new_tokens=new, tools=tools)["reasoning_content"] == expected.reasoning

    chunks = list(client.chat.completions.create(model="m", messages=QUESTION, max_tokens=new,
                                                 temperature=0, tools=tools, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    thought = "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
    assert thought == "".join(d.model_extra.get("reasoning") or "" for d in deltas)
    assert thought == (message.reasoning_content or "")
    assert "".join(d.content or "" for d in deltas) == (message.content or "")
    pieces = list(om.stream_chat(QUESTION, max_new_tokens=new, tools=tools, reasoning=True))
    assert "".join(r for r, _ in pieces) == (expected.reasoning or "")
    if name != "call":  # the Responses API: the answer alone, whole and streamed alike
        whole = client.responses.create(model="m", input=QUESTION, max_output_tokens=new, temperature=0)
        assert whole.output_text == (expected.content or "")
        events = list(client.responses.create(model="m", input=QUESTION, max_output_tokens=new,
                                              temperature=0, stream=True))
        assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == whole.output_text


def test_thinking_switches_render_as_the_template_says_and_others_are_refused(served):
    name, om, url = served
    client = _client(url)
    if name == "qwen3":
        prompt = om.tokenizer.apply_chat_template(QUESTION, enable_thinking=False)
        assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
        off = {"chat_template_kwargs": {"enable_thinking": False}}
        reply = client.chat.completions.create(model="m", messages=QUESTION, max_tokens=8, temperature=0,
                                               extra_body=off)
        message = reply.choices[0].message
        raw = _raw(om, url, 8, enable_thinking=False)
        assert raw == "Sunny" and split(raw, "think").reasoning is None
        assert message.reasoning_content is None and message.content == "Sunny"
        assert om.chat(QUESTION, max_new_tokens=8, enable_thinking=False)["content"] == message.content
        refused = {"reasoning_effort": "high"}
    else:
        prompt = om.tokenizer.apply_chat_template(QUESTION, reasoning_effort="high")
        assert "Reasoning: high\n\n" in prompt and "Reasoning: medium" not in prompt
        reply = client.chat.completions.create(model="m", messages=QUESTION, max_tokens=4, temperature=0,
                                               reasoning_effort="low")
        assert reply.choices[0].message.content is not None or reply.choices[0].message.tool_calls
        refused = {"chat_template_kwargs": {"enable_thinking": False}}
    with httpx.Client(base_url=url, timeout=60) as http:
        for body, said in [(refused, "has no such switch"),
                           ({"reasoning_effort": "extreme"} if name != "qwen3" else refused,
                            "is not allowed" if name != "qwen3" else "has no such switch")]:
            answer = http.post("/v1/chat/completions", json={"model": "m", "messages": QUESTION, **body})
            assert answer.status_code == 400 and said in answer.json()["error"]["message"]
        assert http.post("/v1/completions", json={"model": "m", "prompt": [1, 2], "max_tokens": 2}
                         ).status_code == 200
