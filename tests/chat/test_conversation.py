"""A conversation with a model: the reply of ``chat`` is transformers' ``generate`` on the
rendered prompt (encoded without a second BOS), in PyTorch and in onnxruntime; it ends at the
end of the turn; ``stream_chat`` joins to it; tool calls come back in OpenAI's format."""

from __future__ import annotations

import json

import pytest
import torch

from transformer_kit.core.errors import ChatTemplateError, InputError
from transformer_kit.tokenizer import TextTokenizer

CONVERSATIONS = [
    [{"role": "user", "content": "What is the weather in Paris?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
     {"role": "user", "content": "Tell me more."}],
]
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather now",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}}


def transformers_reply(hf_model, hf_tokenizer, messages, max_new_tokens, tools=None) -> str:
    """transformers' greedy reply on its own rendering of ``messages``."""
    prompt = hf_tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                              add_generation_prompt=True)
    inputs = hf_tokenizer(prompt, add_special_tokens=False, return_tensors="pt")
    with torch.no_grad():
        out = hf_model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
    return hf_tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)


def transformers_finish_reason(hf_model, hf_tokenizer, messages, max_new_tokens) -> str:
    """"stop" when transformers' greedy reply ends with an end id within the budget, else "length"."""
    prompt = hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    inputs = hf_tokenizer(prompt, add_special_tokens=False, return_tensors="pt")
    with torch.no_grad():
        out = hf_model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
    ends = set(hf_model.generation_config.eos_token_id or []) | {hf_tokenizer.eos_token_id}
    return "stop" if set(out[0, inputs["input_ids"].shape[1]:].tolist()) & ends else "length"


def test_the_end_ids_are_the_union_of_config_generation_config_and_tokenizer(chat_checkpoint):
    _, model, om, _, hf_tokenizer = chat_checkpoint
    im_end, text_end = hf_tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    assert sorted(model.config.eos_ids) == sorted([im_end, text_end])
    assert sorted(om.manifest.eos_id) == sorted([im_end, text_end])


def test_the_templates_travel_with_save_and_export(chat_checkpoint, tmp_path):
    import transformer_kit as tk

    _, model, om, _, _ = chat_checkpoint
    assert "chat_template.jinja" in om.manifest.tokenizer
    assert om.tokenizer.chat_templates == model.tokenizer.chat_templates != {}
    model.save(tmp_path / "saved")
    again = tk.load_model(tmp_path / "saved")
    assert again.tokenizer.chat_templates == model.tokenizer.chat_templates
    assert again.chat(CONVERSATIONS[0], max_new_tokens=8) == model.chat(CONVERSATIONS[0], max_new_tokens=8)


@pytest.mark.parametrize("index", range(len(CONVERSATIONS)))
def test_the_reply_is_transformers_greedy_reply_in_both_runtimes(chat_checkpoint, index):
    _, model, om, hf_model, hf_tokenizer = chat_checkpoint
    messages = CONVERSATIONS[index]
    expected = transformers_reply(hf_model, hf_tokenizer, messages, 40)
    reason = transformers_finish_reason(hf_model, hf_tokenizer, messages, 40)
    reply = {"role": "assistant", "content": expected, "finish_reason": reason}
    assert model.chat(messages, max_new_tokens=40) == reply
    assert om.chat(messages, max_new_tokens=40) == reply
    assert "".join(om.stream_chat(messages, max_new_tokens=40)) == expected
    assert "".join(model.stream_chat(messages, max_new_tokens=40)) == expected


def test_a_reply_stops_at_the_end_of_the_turn(chat_checkpoint):
    """Some of the conversations end before max_new_tokens: at <|im_end|>, not config.json's
    <|endoftext|> (the parity above would fail if the kit ran on)."""
    _, _, om, _, hf_tokenizer = chat_checkpoint
    im_end = hf_tokenizer.convert_tokens_to_ids("<|im_end|>")
    tokenizer = om.tokenizer
    stopped = 0
    for messages in CONVERSATIONS + [[{"role": "user", "content": w}] for w in ("a", "b", "sunny", "0")]:
        ids, _ = tokenizer.encode([tokenizer.apply_chat_template(messages)], add_special_tokens=False)
        tokens = om.generate(ids, max_new_tokens=60)[0].tolist()
        stopped += im_end in tokens
    assert stopped > 0


def test_a_rendered_chat_is_encoded_without_a_second_bos(tmp_path):
    """A tokenizer whose post-processor adds BOS, a template that writes it: one BOS, as
    transformers' apply_chat_template(tokenize=True)."""
    import transformers as hf
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {t: i for i, t in enumerate(["<s>", "</s>", "<unk>", "hi", "user", ":"])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    reference = hf.PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
        chat_template="{{ bos_token }}{% for m in messages %}{{ m.role }} : {{ m.content }}{% endfor %}")
    reference.save_pretrained(tmp_path)
    ours = TextTokenizer.from_folder(tmp_path)
    messages = [{"role": "user", "content": "hi"}]
    ids, _ = ours.encode([ours.apply_chat_template(messages)], add_special_tokens=False)
    expected = hf.AutoTokenizer.from_pretrained(tmp_path).apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert ids[0].tolist() == list(expected) == [0, 4, 5, 3]


def test_a_forced_tool_call_parses_into_openai_tool_calls(chat_checkpoint):
    _, model, om, _, _ = chat_checkpoint
    messages = CONVERSATIONS[0]
    for runtime in (model, om):
        reply = runtime.chat(messages, tools=[WEATHER], tool_choice="required", max_new_tokens=48)
        assert reply["role"] == "assistant" and reply["content"] is None
        (call,) = reply["tool_calls"]
        assert call["type"] == "function" and call["id"].startswith("call_")
        assert call["function"]["name"] == "get_weather"
        assert isinstance(json.loads(call["function"]["arguments"])["city"], str)
    named = om.chat(messages, tools=[WEATHER], max_new_tokens=48,
                    tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert named["tool_calls"][0]["function"]["name"] == "get_weather"


def test_a_forced_call_of_a_tool_with_an_unknown_format_is_read_leniently(chat_checkpoint):
    """Parameters with ``format: url`` and ``oneOf`` (which llguidance refuses unless lenient):
    the forced call is made and its arguments validate."""
    import jsonschema

    from tests.chat.schemas import LENIENT_SCHEMAS

    _, _, om, _, _ = chat_checkpoint
    for parameters, _ in LENIENT_SCHEMAS.values():
        tool = {"type": "function", "function": {"name": "visit", "parameters": parameters}}
        reply = om.chat(CONVERSATIONS[0], tools=[tool], tool_choice="required", max_new_tokens=48)
        arguments = json.loads(reply["tool_calls"][0]["function"]["arguments"])
        jsonschema.validate(arguments, parameters)


def test_both_runtimes_give_the_same_constrained_reply(chat_checkpoint):
    _, model, om, _, _ = chat_checkpoint
    options = {"tools": [WEATHER], "tool_choice": "required", "max_new_tokens": 48}
    first = model.chat(CONVERSATIONS[1], **options)["tool_calls"][0]["function"]
    assert om.chat(CONVERSATIONS[1], **options)["tool_calls"][0]["function"] == first


def test_chat_refuses_what_it_cannot_do(chat_checkpoint):
    _, _, om, _, _ = chat_checkpoint
    with pytest.raises(InputError, match="tool_choice"):
        om.chat(CONVERSATIONS[0], tool_choice="required")
    with pytest.raises(InputError, match="one reply"):
        om.chat(CONVERSATIONS[0], num_beams=2)
    with pytest.raises(InputError, match="not among the tools"):
        om.chat(CONVERSATIONS[0], tools=[WEATHER], tool_choice={"type": "function",
                                                                "function": {"name": "nope"}})
    with pytest.raises(ChatTemplateError, match="non-empty list"):
        om.chat([])
    with pytest.raises(InputError, match="both constrain"):
        om.chat(CONVERSATIONS[0], tools=[WEATHER], tool_choice="required",
                response_format={"type": "json_object"})
    with pytest.raises(InputError, match="may not set 'messages', 'special_tokens'"):
        om.chat(CONVERSATIONS[0], template_kwargs={"special_tokens": {}, "messages": []})


def test_a_reply_says_when_the_budget_cut_it(chat_checkpoint):
    """finish_reason "length" when max_new_tokens ended the reply (transformers' reply has no end
    id in it), "stop" for an end id or a stop string; generate's texts carry it too."""
    _, model, om, hf_model, hf_tokenizer = chat_checkpoint
    messages = CONVERSATIONS[0]
    assert transformers_finish_reason(hf_model, hf_tokenizer, messages, 3) == "length"
    for runtime in (model, om):
        cut = runtime.chat(messages, max_new_tokens=3)
        assert cut == {"role": "assistant", "finish_reason": "length",
                       "content": transformers_reply(hf_model, hf_tokenizer, messages, 3)}
        stop = cut["content"][-1]
        stopped = runtime.chat(messages, max_new_tokens=3, stop=[stop])
        assert stopped["finish_reason"] == "stop" and stop not in stopped["content"]
        texts = runtime.generate(["Hello", "Hi there"], max_new_tokens=2)
        assert [t.finish_reason for t in texts] == ["length", "length"]
        assert runtime.generate("Hello", max_new_tokens=2, eos_id=list(range(600))).finish_reason == "stop"
