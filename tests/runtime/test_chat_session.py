"""ChatSession: each reply is transformers' greedy reply to the conversation so far (rendered by
transformers with the same chat template), streamed in pieces; the history keeps the completed
replies, reset forgets them, an unfinished reply is dropped; a reply's default budget is the room
the rendered conversation leaves in the context.

The prompts are encoded and the replies decoded with tokenizer.json as the ``tokenizers`` library
reads it: transformers' ``AutoTokenizer`` loads this Qwen2 checkpoint's as a ``Qwen2Tokenizer``,
whose own pre-tokenizer splits digits apart, and a random model's reply holds digits."""

from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer

import transformer_kit as tk
from tests.chat.reasoning_checkpoint import write_reasoning_checkpoint
from transformer_kit.chat.conversation import DEFAULT_REPLY_TOKENS
from transformer_kit.core.errors import InputError, TransformerKitError
from transformer_kit.export import export_onnx
from transformer_kit.runtime import ChatSession, OnnxModel

SYSTEM = "Be brief."


@pytest.fixture(scope="module")
def reference(chat_checkpoint):
    """(transformers' model, its tokenizer (for the template), tokenizer.json's Tokenizer)."""
    folder, _, _, hf_model, hf_tokenizer = chat_checkpoint
    return hf_model, hf_tokenizer, Tokenizer.from_file(str(folder / "tokenizer.json"))


def prompt_ids(reference, messages: list[dict]) -> list[int]:
    """The conversation rendered by transformers (a reply to come), encoded by tokenizer.json."""
    _, hf_tokenizer, tokenizer = reference
    prompt = hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer.encode(prompt, add_special_tokens=False).ids


def transformers_reply(reference, messages: list[dict], max_new_tokens: int) -> str:
    """transformers' greedy reply to ``messages``, to the end of the turn."""
    hf_model, _, tokenizer = reference
    ids = prompt_ids(reference, messages)
    with torch.no_grad():
        out = hf_model.generate(torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False)
    return tokenizer.decode(out[0, len(ids):].tolist(), skip_special_tokens=True)


def system() -> dict:
    return {"role": "system", "content": SYSTEM}


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def test_replies_are_transformers_replies_to_the_conversation_so_far(chat_checkpoint, reference):
    om = chat_checkpoint[2]
    session = ChatSession(om, SYSTEM, max_new_tokens=24)
    first = "".join(session.reply("Name a colour."))
    assert first == transformers_reply(reference, [system(), user("Name a colour.")], 24)
    history = [system(), user("Name a colour."), {"role": "assistant", "content": first}]
    assert session.messages == history
    second = list(session.reply("Tell me more."))
    assert len(second) > 1, "the reply comes in pieces"
    assert "".join(second) == transformers_reply(reference, [*history, user("Tell me more.")], 24)
    session.reset()
    assert session.messages == [system()]
    assert "".join(session.reply("Name a colour.")) == first


def test_an_unfinished_reply_is_dropped(chat_checkpoint):
    _, _, om, _, _ = chat_checkpoint
    session = ChatSession(om, max_new_tokens=24)
    reply = session.reply("hello")
    next(reply)
    reply.close()
    assert session.messages == []


def test_the_default_budget_is_the_room_the_context_leaves(chat_checkpoint, reference):
    om, hf_tokenizer = chat_checkpoint[2], reference[1]
    assert om.context_length == 1024
    session = ChatSession(om)
    short, long, too_long = ([user("The weather in Paris is sunny. " * times)] for times in (1, 110, 300))

    def rendered(messages: list[dict]) -> str:
        return hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    assert session.budget(rendered(short)) == DEFAULT_REPLY_TOKENS
    left = om.context_length - len(prompt_ids(reference, long))
    assert 0 < left < DEFAULT_REPLY_TOKENS
    assert session.budget(rendered(long)) == left
    with pytest.raises(InputError, match=f"takes {len(prompt_ids(reference, too_long))} tokens"):
        session.budget(rendered(too_long))
    with pytest.raises(InputError, match="no reply fits"):
        list(session.reply(too_long[0]["content"]))
    assert session.messages == []
    assert ChatSession(om, max_new_tokens=5).budget(rendered(too_long)) == 5
    assert "".join(session.reply(long[0]["content"])) == transformers_reply(reference, long, left)


def test_what_cannot_run_is_refused_at_once(chat_checkpoint, gpt2_text):
    _, _, om, _, _ = chat_checkpoint
    with pytest.raises(InputError, match="temperature"):
        ChatSession(om, do_sample=True, temperature=-1.0)
    with pytest.raises(TransformerKitError, match="names no template"):
        ChatSession(om, chat_template="tool_use")
    with pytest.raises(TransformerKitError, match="no chat template"):
        ChatSession(gpt2_text[1])


def test_a_reasoning_model_s_history_keeps_the_thinking_apart(tmp_path):
    """gpt-oss's template refuses a message whose content holds channel markup: the history keeps
    the reply as the assistant's message, its thinking as reasoning_content."""
    chain = ["assistant", "<|channel|>", "analysis", "<|message|>", "The user asks", "<|end|>",
             "<|start|>", "assistant"]
    folder = write_reasoning_checkpoint(tmp_path / "harmony", "harmony", [chain])
    export_onnx(tk.from_hf(folder), folder / "onnx")
    session = ChatSession(OnnxModel(folder / "onnx", providers="cpu"), max_new_tokens=16)
    first = "".join(session.reply("Hello"))
    assert first.startswith("<|channel|>analysis<|message|>The user asks<|end|>")
    assert session.messages[-1]["content"] == ""
    assert session.messages[-1]["reasoning_content"].startswith("The user asks\nThe user asks")
    assert "".join(session.reply("Again")) == first  # the history renders
