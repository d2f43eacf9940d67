"""transformer-kit chat: the replies of OnnxModel.chat, turn after turn, with --message or typed
on stdin; structured output; one-line errors."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import transformer_kit as tk
from tests.apps.conftest import invoke
from tests.chat.checkpoint import write_chat_checkpoint
from transformer_kit.apps.cli import app
from transformer_kit.export import export_onnx
from transformer_kit.runtime import OnnxModel


@pytest.fixture(scope="module")
def chat_export(tmp_path_factory):
    """An export of a random Qwen2 with a ChatML tokenizer and the Qwen2.5 chat template."""
    folder = write_chat_checkpoint(tmp_path_factory.mktemp("cli-chat"))
    export_onnx(tk.from_hf(folder), folder / "onnx")
    return folder / "onnx"


@pytest.fixture(scope="module")
def om(chat_export):
    return OnnxModel(chat_export, providers="cpu")


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def typed(folder, lines: str, *flags: str):
    """The command with ``lines`` on stdin (a pipe: no prompt, one line per turn)."""
    return CliRunner().invoke(app, ["chat", str(folder), *flags], input=lines, env={"COLUMNS": "200"})


def test_a_message_gets_onnx_model_s_reply(chat_export, om):
    result = invoke("chat", str(chat_export), "--message", "hello", "--max-new-tokens", "12")
    assert result.exit_code == 0, result.output
    assert result.output == om.chat([user("hello")], max_new_tokens=12)["content"] + "\n"


def test_the_system_message_comes_first(chat_export, om):
    system = {"role": "system", "content": "You answer in a few words."}
    result = invoke("chat", str(chat_export), "--system", system["content"], "--message", "hello",
                    "--max-new-tokens", "12")
    assert result.exit_code == 0, result.output
    assert result.output == om.chat([system, user("hello")], max_new_tokens=12)["content"] + "\n"
    assert result.output != om.chat([user("hello")], max_new_tokens=12)["content"] + "\n"


def test_messages_keep_the_history(chat_export, om):
    result = invoke("chat", str(chat_export), "--message", "hello", "--message", "and then?",
                    "--max-new-tokens", "8")
    assert result.exit_code == 0, result.output
    first = om.chat([user("hello")], max_new_tokens=8)
    second = om.chat([user("hello"), first, user("and then?")], max_new_tokens=8)
    assert result.output == first["content"] + "\n" + second["content"] + "\n"


def test_sampling_options_reach_the_reply(chat_export, om):
    options = {"do_sample": True, "temperature": 0.7, "top_k": 20, "seed": 3, "repetition_penalty": 1.3}
    result = invoke("chat", str(chat_export), "--message", "hello", "--max-new-tokens", "10",
                    "--do-sample", "--temperature", "0.7", "--top-k", "20", "--seed", "3",
                    "--repetition-penalty", "1.3")
    assert result.exit_code == 0, result.output
    assert result.output == om.chat([user("hello")], max_new_tokens=10, **options)["content"] + "\n"


def test_the_default_budget_is_what_the_context_has_left(chat_export, om):
    text = "The weather in Paris is sunny. " * 120
    prompt = om.tokenizer.apply_chat_template([user(text)])
    used = om.tokenizer.encode([prompt], add_special_tokens=False)[0].shape[1]
    left = om.context_length - used
    assert 0 < left < 256, "the message should leave less than the default 256 tokens"
    result = invoke("chat", str(chat_export), "--message", text)
    assert result.exit_code == 0, result.output
    assert result.output == om.chat([user(text)], max_new_tokens=left)["content"] + "\n"


def test_structured_output(chat_export, tmp_path):
    reply = invoke("chat", str(chat_export), "--message", "hello", "--json", "--max-new-tokens", "30")
    assert reply.exit_code == 0, reply.output
    assert isinstance(json.loads(reply.output), dict)
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"n": {"type": "integer"}},
                                  "required": ["n"], "additionalProperties": False}))
    reply = invoke("chat", str(chat_export), "--message", "hi", "--json-schema", str(schema),
                   "--max-new-tokens", "30")
    assert reply.exit_code == 0, reply.output
    assert isinstance(json.loads(reply.output)["n"], int)
    reply = invoke("chat", str(chat_export), "--message", "hi", "--choice", "yes", "--choice", "no")
    assert reply.exit_code == 0, reply.output
    assert reply.output in ("yes\n", "no\n")
    both = invoke("chat", str(chat_export), "--message", "hi", "--json", "--regex", "[a-z]+")
    assert both.exit_code == 2 and "--json and --regex were given" in both.output


def test_a_session_reads_turns_until_exit(chat_export, om):
    result = typed(chat_export, "hello\n/reset\n\nhi\n/exit\nnever read\n", "--max-new-tokens", "6")
    assert result.exit_code == 0, result.output
    first = om.chat([user("hello")], max_new_tokens=6)["content"]
    after_reset = om.chat([user("hi")], max_new_tokens=6)["content"]
    assert result.output == first + "\n" + after_reset + "\n"
    kept = typed(chat_export, "hello\nhi\n", "--max-new-tokens", "6", "--system", "Be brief.")  # ends at EOF
    assert kept.exit_code == 0, kept.output
    system = {"role": "system", "content": "Be brief."}
    first = om.chat([system, user("hello")], max_new_tokens=6)
    second = om.chat([system, user("hello"), first, user("hi")], max_new_tokens=6)["content"]
    assert kept.output == first["content"] + "\n" + second + "\n"


def test_an_error_in_a_turn_does_not_end_the_session(chat_export, om):
    too_long = "The weather in Paris is sunny. " * 200
    result = typed(chat_export, f"{too_long}\nhi\n", "--max-new-tokens", "6")
    assert result.exit_code == 0, result.output
    error, answer = result.output.split("\n", 1)
    assert error.startswith("error: ") and "context" in error
    assert answer == om.chat([user("hi")], max_new_tokens=6)["content"] + "\n"


def test_an_export_without_tokenizer_or_template_is_one_line_error(exported, text_export):
    _, folder = exported
    cases = {folder / "onnx": "has no tokenizer", text_export: "no chat template"}
    for export, named in cases.items():
        result = invoke("chat", str(export), "--message", "hello")
        assert result.exit_code == 1, result.output
        assert named in result.output and "Traceback" not in result.output
        assert result.output.startswith("error: ") and result.output.count("\n") == 1
    checkpoint = invoke("chat", str(text_export.parent), "--message", "hello")  # exported first
    assert checkpoint.exit_code == 1 and "no chat template" in checkpoint.output
    bad = invoke("chat", str(text_export.parent / "nothing"), "--message", "hello")
    assert bad.exit_code == 1 and "export folder" in bad.output and "Traceback" not in bad.output


def test_another_template_from_a_file(chat_export, om, tmp_path):
    """--chat-template FILE renders with that template (SmolLM2's: another default system)."""
    from tests.chat.checkpoint import TEMPLATES

    template = TEMPLATES / "HuggingFaceTB--SmolLM2-135M-Instruct.jinja"
    result = invoke("chat", str(chat_export), "--chat-template", str(template), "--message", "hello",
                    "--max-new-tokens", "12")
    assert result.exit_code == 0, result.output
    expected = om.chat([user("hello")], max_new_tokens=12, chat_template=template.read_text())
    assert result.output == expected["content"] + "\n"
    missing = invoke("chat", str(chat_export), "--chat-template", "tool_use", "--message", "hello")
    assert missing.exit_code == 1 and "names no template" in missing.output


def test_a_checkpoint_or_its_hub_name_is_exported_once_and_chats_as_its_export(om, tmp_path, monkeypatch):
    """chat takes a checkpoint (a folder, or a Hub name from an offline cache): exported into the
    kit's cache once, then the same reply as the export of the same weights; a second run reuses
    the export, --quantize makes another."""
    from tests.checkpoints.hub_cache import place_snapshot

    checkpoint = write_chat_checkpoint(tmp_path / "chat")  # chat_export's weights
    place_snapshot(tmp_path / "hub", "org/chat", checkpoint, "c" * 40)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMER_KIT_CACHE", str(tmp_path / "kit"))
    monkeypatch.chdir(tmp_path / "hub")  # no local folder named org/chat
    expected = om.chat([user("hello")], max_new_tokens=12)["content"] + "\n"
    first = invoke("chat", "org/chat", "--message", "hello", "--max-new-tokens", "12")
    assert first.exit_code == 0, first.output
    assert first.output.startswith("exporting org/chat into ") and first.output.endswith(expected)
    again = invoke("chat", "org/chat", "--message", "hello", "--max-new-tokens", "12")
    assert again.exit_code == 0 and again.output == expected  # the export is reused
    local = invoke("chat", str(checkpoint), "--message", "hello", "--max-new-tokens", "12")
    assert local.exit_code == 0 and local.output.endswith(expected)
    assert len(list((tmp_path / "kit" / "exports").iterdir())) == 2  # the Hub's and the folder's
    int4 = invoke("chat", "org/chat", "--quantize", "int4", "--message", "hello", "--max-new-tokens", "4")
    assert int4.exit_code == 0, int4.output
    assert len(list((tmp_path / "kit" / "exports").iterdir())) == 3
    refused = invoke("chat", str(tmp_path / "kit" / "exports" / sorted(
        p.name for p in (tmp_path / "kit" / "exports").iterdir())[0]), "--quantize", "int8",
        "--message", "hello")
    assert refused.exit_code == 1 and "is an export folder, already made" in refused.output


def test_a_reasoning_model_s_thinking_is_shown_apart_from_its_answer(tmp_path):
    """Qwen3's template and a model that thinks then answers: ``[thinking]`` then ``[answer]``,
    without the markup, as OnnxModel.chat splits the same reply."""
    from tests.chat.reasoning_checkpoint import write_reasoning_checkpoint

    chain = ["\n", "<think>", "The user asks", "</think>", " Paris is sunny", "<|im_end|>"]
    folder = write_reasoning_checkpoint(tmp_path / "qwen3", "qwen3", [chain])
    export_onnx(tk.from_hf(folder), folder / "onnx")
    said = OnnxModel(folder / "onnx", providers="cpu").chat([user("Weather?")], max_new_tokens=16)
    assert said["reasoning_content"] and said["content"]
    result = invoke("chat", str(folder / "onnx"), "--message", "Weather?", "--max-new-tokens", "16")
    assert result.exit_code == 0, result.output
    assert result.output == f"[thinking] {said['reasoning_content']}\n[answer] {said['content']}\n"
