"""Reasoning split from the answer: ``<think>`` (Qwen3, R1 distills) and gpt-oss's harmony
channels, whole replies and every streamed cut of them alike; the thinking switches as the real
templates render them (against transformers) and refused where a template has none; a PyTorch
model's ``chat`` returning ``reasoning_content`` that Qwen3's template reads back."""

from __future__ import annotations

import json

import pytest
import transformers as hf

import transformer_kit as tk
from tests.chat.checkpoint import TEMPLATES, chatml_tokenizer
from tests.chat.reasoning_checkpoint import (
    GPT_OSS_TEMPLATE,
    HARMONY,
    QWEN3_TEMPLATE,
    train_tokenizer,
    write_reasoning_checkpoint,
)
from transformer_kit.chat.reasoning import Splitter, reasoning_format, split
from transformer_kit.core.errors import InputError
from transformer_kit.tokenizer import TextTokenizer

QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
THINK = [  # (reply, the prompt left <think> open, reasoning, content)
    ("<think>\nThe user greets.\n</think>\n\nHello!", False, "The user greets.", "Hello!"),
    ("The user greets.\n</think>\n\nHello!", True, "The user greets.", "Hello!"),
    ("<think>\n\n</think>\n\nHello!", False, "", "Hello!"),
    ("Hello! <think>not at the start</think>", False, None, "Hello! <think>not at the start</think>"),
    ("\n<think>cut in the mid", False, "cut in the mid", ""),
    ("Hello!", False, None, "Hello!"),
    ("<thin", False, None, "<thin"),
]
# (reply after "<|start|>assistant", reasoning, content, calls), as openai/harmony writes them
HARMONY_REPLIES = [
    ("<|channel|>analysis<|message|>User asks a simple question.<|end|><|start|>assistant<|channel|>final"
     "<|message|>2 + 2 = 4.", "User asks a simple question.", "2 + 2 = 4.", []),
    ("<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary "
     'to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}', "Need the weather.", "",
     [("get_weather", '{"city":"Paris"}')]),
    (' to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}', None, "",
     [("get_weather", '{"city": "Paris"}')]),
    ("<|channel|>analysis<|message|>One.<|end|><|start|>assistant<|channel|>analysis<|message|>Two.<|end|>"
     "<|start|>assistant<|channel|>commentary<|message|>Checking. <|end|><|start|>assistant<|channel|>final"
     "<|message|>Done", "One.\nTwo.", "Checking. Done", []),
    ("<|channel|>analysis<|message|>cut in the mid", "cut in the mid", "", []),
    ("plain text without channels", None, "plain text without channels", []),
]


def _streamed(text: str, fmt: str, thinking: bool, cuts: list[int]) -> tuple[str, str, list]:
    splitter, reasoning, content = Splitter(fmt, thinking), [], []
    for start, end in zip([0, *cuts], [*cuts, len(text)], strict=True):
        r, c = splitter.add(text[start:end])
        reasoning.append(r), content.append(c)
    r, c = splitter.finish()
    return "".join(reasoning) + r, "".join(content) + c, splitter.calls


@pytest.mark.parametrize(("text", "thinking", "reasoning", "content"), THINK)
def test_think_tags_split_whole_and_at_every_cut(text, thinking, reasoning, content):
    whole = split(text, "think", thinking)
    assert (whole.reasoning, whole.content) == (reasoning, content)
    for cut in range(len(text) + 1):
        assert _streamed(text, "think", thinking, [cut]) == (reasoning or "", content, [])
    assert _streamed(text, "think", thinking, list(range(1, len(text)))) == (reasoning or "", content, [])


@pytest.mark.parametrize(("text", "reasoning", "content", "calls"), HARMONY_REPLIES)
def test_harmony_channels_split_whole_and_at_every_cut(text, reasoning, content, calls):
    whole = split(text, "harmony")
    assert (whole.reasoning, whole.content, whole.calls) == (reasoning, content, calls)
    for cut in range(len(text) + 1):
        assert _streamed(text, "harmony", False, [cut]) == (reasoning or "", content, calls)
    assert _streamed(text, "harmony", False, list(range(1, len(text)))) == (reasoning or "", content, calls)


def test_the_format_follows_the_template():
    read = lambda name: (TEMPLATES / name).read_text(encoding="utf-8")  # noqa: E731
    assert reasoning_format(QWEN3_TEMPLATE.read_text(encoding="utf-8")) == "think"
    assert reasoning_format(read("deepseek-ai--DeepSeek-R1-Distill-Llama-8B.jinja")) == "think"
    assert reasoning_format(GPT_OSS_TEMPLATE.read_text(encoding="utf-8")) == "harmony"
    assert reasoning_format(read("Qwen--Qwen2.5-7B-Instruct.jinja")) is None


def _tokenizer(template: str, harmony: bool = False) -> TextTokenizer:
    backend = train_tokenizer(HARMONY["special"], []) if harmony else chatml_tokenizer()
    return TextTokenizer({"tokenizer.json": backend.to_str().encode(),
                          "chat_template.jinja": template.encode(),
                          "tokenizer_config.json": json.dumps({"eos_token": "<|im_end|>"}).encode()})


def test_an_r1_prompt_opens_the_thinking_and_the_reply_is_read_from_inside_it():
    tokenizer = _tokenizer((TEMPLATES / "deepseek-ai--DeepSeek-R1-Distill-Llama-8B.jinja").read_text("utf-8"))
    turn = tokenizer.chat_turn(QUESTION, options={})
    assert turn.prompt.endswith("<think>\n") and turn.thinking
    assert turn.message("Sunny, I recall.\n</think>\n\nIt is sunny.") == {
        "role": "assistant", "content": "It is sunny.", "reasoning_content": "Sunny, I recall."}


def test_harmony_decoding_keeps_the_channels_and_tool_calls_are_read():
    tokenizer = _tokenizer(GPT_OSS_TEMPLATE.read_text(encoding="utf-8"), harmony=True)
    text = '<|channel|>analysis<|message|>Need it.<|end|><|start|>assistant to=functions.get_weather'
    ids = tokenizer.encode([text + "<|return|><|endoftext|>"], add_special_tokens=False)[0][0].tolist()
    assert tokenizer.decode(ids) == text  # markup kept, the end tokens skipped
    turn = tokenizer.chat_turn(QUESTION, tools=[WEATHER], options={})
    assert turn.prompt.endswith("<|start|>assistant") and "type get_weather = (_: {" in turn.prompt
    message = turn.message(text + '<|channel|>commentary json<|message|>{"city": "Paris"}')
    assert message["reasoning_content"] == "Need it." and message["content"] is None
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]] == [
        ("get_weather", '{"city": "Paris"}')]
    with pytest.raises(InputError, match="cannot be forced with this model's harmony chat template"):
        tokenizer.chat_turn(QUESTION, tools=[WEATHER], tool_choice="required", options={})


def test_a_thinking_model_s_tool_calls_are_read_after_its_thinking_and_its_thinking_is_rendered_back():
    qwen3 = _tokenizer(QWEN3_TEMPLATE.read_text(encoding="utf-8"))
    qwen3 = qwen3.chat_turn(QUESTION, tools=[WEATHER], options={})
    message = qwen3.message('<think>\nI need the weather.\n</think>\n\n<tool_call>\n'
                            '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')
    assert (message["reasoning_content"], message["content"]) == ("I need the weather.", None)
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]] == [
        ("get_weather", '{"city": "Paris"}')]
    harmony = _tokenizer(GPT_OSS_TEMPLATE.read_text(encoding="utf-8"), harmony=True)
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    history = [*QUESTION, {"role": "assistant", "content": None, "reasoning_content": "Need it.",
                           "tool_calls": [call]},
               {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    prompt = harmony.chat_turn(history, tools=[WEATHER], options={}).prompt
    assert ("<|start|>assistant<|channel|>analysis<|message|>Need it.<|end|><|start|>assistant "
            'to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}<|call|>'
            '<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"sunny"<|end|>'
            "<|start|>assistant") in prompt


@pytest.mark.parametrize(("template", "kwargs", "said"), [
    ("Qwen--Qwen2.5-7B-Instruct.jinja", {"enable_thinking": False}, "has no such switch"),
    ("deepseek-ai--DeepSeek-R1-Distill-Llama-8B.jinja", {"enable_thinking": False}, "has no such switch"),
    ("Qwen--Qwen3-0.6B.jinja", {"reasoning_effort": "low"}, "has no such switch"),
    ("Qwen--Qwen3-0.6B.jinja", {"enable_thinking": "no"}, "is not allowed; give one of True, False"),
    ("openai--gpt-oss-120b.jinja", {"reasoning_effort": "extreme"}, "is not allowed; give one of 'low'"),
])
def test_a_switch_the_template_lacks_or_a_value_it_does_not_take_is_refused(template, kwargs, said):
    tokenizer = _tokenizer((TEMPLATES / template).read_text("utf-8"), harmony="gpt-oss" in template)
    with pytest.raises(InputError, match=said):
        tokenizer.chat_turn(QUESTION, template_kwargs=kwargs, options={})


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    chains = [["\n", "<think>", "The user asks", "</think>", " Paris is sunny", "<|im_end|>"],
              ["\n\n", "Sunny", "<|im_end|>"]]
    return write_reasoning_checkpoint(tmp_path_factory.mktemp("qwen3") / "model", "qwen3", chains)


def test_a_pytorch_model_s_chat_returns_the_thinking_and_the_template_reads_it_back(qwen3):
    model, reference = tk.from_hf(qwen3), hf.AutoTokenizer.from_pretrained(qwen3)
    off = model.tokenizer.apply_chat_template(QUESTION, enable_thinking=False)
    assert off == reference.apply_chat_template(QUESTION, tokenize=False, add_generation_prompt=True,
                                                enable_thinking=False)
    assert off.endswith("<think>\n\n</think>\n\n")
    reply = model.chat(QUESTION, max_new_tokens=16)
    assert reply == {"role": "assistant", "content": "Paris is sunny", "reasoning_content": "The user asks",
                     "finish_reason": "stop"}
    assert model.chat(QUESTION, max_new_tokens=16, enable_thinking=False) == {
        "role": "assistant", "content": "Sunny", "reasoning_content": None, "finish_reason": "stop"}
    assert list(model.stream_chat(QUESTION, max_new_tokens=16)) and \
        "".join(model.stream_chat(QUESTION, max_new_tokens=16)) == "Paris is sunny"
    pairs = list(model.stream_chat(QUESTION, max_new_tokens=16, reasoning=True))
    assert ("".join(r for r, _ in pairs), "".join(c for _, c in pairs)) == ("The user asks", "Paris is sunny")
    follow_up = [*QUESTION, reply, {"role": "user", "content": "And tomorrow?"}]
    prompt = model.tokenizer.apply_chat_template(follow_up)
    assert prompt == reference.apply_chat_template(follow_up, tokenize=False, add_generation_prompt=True)
