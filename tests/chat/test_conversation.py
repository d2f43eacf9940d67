"""A conversation with a model: the reply of ``chat`` is transformers' ``generate`` on the
rendered prompt (encoded without a second BOS), in PyTorch and in onnxruntime; it ends at the
end of the turn; ``stream_chat`` joins to it; tool calls come back in OpenAI's format, on a
template that renders no tools too (the kit writes them, as docs/chat.md documents)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.chat.test_tool_prompt import documented_text
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


TEMPLATES = Path(__file__).parent / "data" / "templates"
#: Templates that never read ``tools``: the kit gives the model the tools (docs/chat.md).
SMOLLM2 = (TEMPLATES / "HuggingFaceTB--SmolLM2-135M-Instruct.jinja").read_text(encoding="utf-8")
GEMMA2 = (TEMPLATES / "google--gemma-2-2b-it.jinja").read_text(encoding="utf-8")
R1 = (TEMPLATES / "deepseek-ai--DeepSeek-R1-Distill-Llama-8B.jinja").read_text(encoding="utf-8")
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def _with_text(messages: list[dict], text: str) -> list[dict]:
    """The conversation with the tools' text as docs/chat.md says: after the system message's
    text and a blank line, or as a system message first."""
    if messages[0]["role"] == "system":
        return [{"role": "system", "content": f"{messages[0]['content']}\n\n{text}"}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def _call(reply: dict) -> tuple[str, dict]:
    (call,) = reply["tool_calls"]
    return call["function"]["name"], json.loads(call["function"]["arguments"])


@pytest.mark.parametrize("choice", ["required", NAMED], ids=["required", "named"])
@pytest.mark.parametrize("index", [0, 1], ids=["no-system", "system"])
def test_a_forced_call_on_a_template_without_tools_gets_them_in_the_system_message(chat_checkpoint,
                                                                                   choice, index):
    """The prompt is transformers' rendering of the conversation with the documented tools' text
    as (or after) its system message; the reply is the same call in both runtimes, its arguments
    valid against the parameters, its raw text the call object as json.dumps writes it."""
    import jsonschema

    _, model, om, _, hf_tokenizer = chat_checkpoint
    messages = CONVERSATIONS[index]
    closing = ("Answer now with a call to one of the tools." if choice == "required"
               else "Answer now with a call to the tool get_weather.")
    system = _with_text(messages, documented_text([WEATHER], closing))
    expected = hf_tokenizer.apply_chat_template(system, chat_template=SMOLLM2, tokenize=False,
                                                add_generation_prompt=True)
    options = {"tools": [WEATHER], "tool_choice": choice, "chat_template": SMOLLM2}
    assert om.tokenizer.chat_turn(messages, options={}, **options).prompt == expected
    reply = om.chat(messages, max_new_tokens=48, **options)
    assert reply["content"] is None and reply["finish_reason"] == "tool_calls"
    name, arguments = _call(reply)
    assert name == "get_weather"
    jsonschema.validate(arguments, WEATHER["function"]["parameters"])
    assert _call(model.chat(messages, max_new_tokens=48, **options)) == (name, arguments)
    raw = "".join(om.stream_chat(messages, max_new_tokens=48, **options))
    assert raw == json.dumps({"tool_call": {"name": name, "arguments": arguments}}, ensure_ascii=False)


def test_a_template_that_refuses_a_system_message_gets_the_tools_before_the_question(chat_checkpoint):
    _, _, om, _, _ = chat_checkpoint
    messages = CONVERSATIONS[0]
    text = documented_text([WEATHER], "Answer now with a call to one of the tools.")
    with pytest.raises(ChatTemplateError, match="System role not supported"):
        om.tokenizer.apply_chat_template([{"role": "system", "content": "x"}, *messages],
                                         chat_template=GEMMA2)
    turn = om.tokenizer.chat_turn(messages, tools=[WEATHER], tool_choice="required", chat_template=GEMMA2,
                                  options={})
    assert turn.prompt == om.tokenizer.apply_chat_template(
        [{"role": "user", "content": f"{text}\n\n{messages[0]['content']}"}], chat_template=GEMMA2)
    assert _call(om.chat(messages, tools=[WEATHER], tool_choice="required", chat_template=GEMMA2,
                         max_new_tokens=48))[0] == "get_weather"


def test_a_forced_call_closes_an_open_thinking_block_first(chat_checkpoint):
    """The R1 distills' prompt ends inside <think>: the forced call is written after </think>, as
    the answer (an empty thinking), not as the thinking."""
    _, model, om, _, _ = chat_checkpoint
    options = {"tools": [WEATHER], "tool_choice": "required", "chat_template": R1, "max_new_tokens": 48}
    assert om.tokenizer.chat_turn(CONVERSATIONS[0], options={}, **{k: options[k] for k in (
        "tools", "tool_choice", "chat_template")}).prompt.endswith("<think>\n")
    reply = om.chat(CONVERSATIONS[0], **options)
    assert reply["reasoning_content"] == "" and reply["content"] is None
    assert _call(reply)[0] == "get_weather" and _call(model.chat(CONVERSATIONS[0], **options)) == _call(reply)
    pairs = list(om.stream_chat(CONVERSATIONS[0], reasoning=True, **options))
    assert "".join(said for _, said in pairs).startswith('{"tool_call": ')


def test_auto_on_a_template_without_tools_is_a_call_or_plain_text(chat_checkpoint):
    """``auto``: the documented prompt, and the reply generate gives there under the grammar of a
    call or text that opens no object (built here from its parts), read back."""
    _, model, om, _, _ = chat_checkpoint
    from transformer_kit.chat.tool_calls import forced_call_grammar

    grammar = forced_call_grammar([WEATHER], None, "generic", or_text=True)
    for messages in CONVERSATIONS:
        text = documented_text([WEATHER], "If no tool is needed, answer in plain text.")
        prompt = om.tokenizer.apply_chat_template(_with_text(messages, text), chat_template=SMOLLM2)
        said = om.generate(prompt, add_special_tokens=False, max_new_tokens=40,
                           response_format={"type": "grammar", "grammar": grammar})
        reply = om.chat(messages, tools=[WEATHER], chat_template=SMOLLM2, max_new_tokens=40)
        again = model.chat(messages, tools=[WEATHER], chat_template=SMOLLM2, max_new_tokens=40)
        if said.startswith("{"):
            assert _call(reply) == _call(again) == ("get_weather", json.loads(said)["tool_call"]["arguments"])
        else:
            assert reply == again == {"role": "assistant", "content": str(said),
                                      "finish_reason": said.finish_reason}


def test_none_leaves_the_tools_out_and_a_tool_history_renders_in_the_calls_form(chat_checkpoint):
    _, _, om, _, hf_tokenizer = chat_checkpoint
    messages = CONVERSATIONS[0]
    assert om.chat(messages, tools=[WEATHER], tool_choice="none", chat_template=SMOLLM2, max_new_tokens=8) \
        == om.chat(messages, chat_template=SMOLLM2, max_new_tokens=8)
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    history = [*messages, {"role": "assistant", "content": None, "tool_calls": [call]},
               {"role": "tool", "tool_call_id": "call_1", "content": "21 C"}]
    said = '{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}'
    written = [*messages, {"role": "assistant", "content": said},
               {"role": "user", "content": '{"tool_result": {"name": "get_weather", "content": "21 C"}}'}]
    text = documented_text([WEATHER], "If no tool is needed, answer in plain text.")
    for tools, system in (([WEATHER], [{"role": "system", "content": text}]), (None, [])):
        expected = hf_tokenizer.apply_chat_template([*system, *written], chat_template=SMOLLM2,
                                                    tokenize=False, add_generation_prompt=True)
        turn = om.tokenizer.chat_turn(history, tools=tools, chat_template=SMOLLM2, options={})
        assert turn.prompt == expected
