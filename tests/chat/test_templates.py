"""Chat templates render exactly what transformers' ``apply_chat_template`` renders: real
templates of eleven checkpoints (tests/chat/data/templates, sources in SOURCES.md) over
conversations with a system message, several turns, tools and tool results, with and without
the generation prompt; and templates are found where transformers finds them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import transformers as hf
from tokenizers import Tokenizer, models, pre_tokenizers

from transformer_kit.core.errors import ChatTemplateError
from transformer_kit.tokenizer import TextTokenizer

TEMPLATES = sorted((Path(__file__).parent / "data" / "templates").glob("*.jinja"))
SPECIAL = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "The city"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}
CALL = {"id": "call12345", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}
CONVERSATIONS = {
    "user": ([{"role": "user", "content": "Hello, who are you?"}], None),
    "system": ([{"role": "system", "content": "You are terse."},
                {"role": "user", "content": "Name a colour."}], None),
    "turns": ([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
               {"role": "user", "content": "Tell me a joke about cats."}], None),
    "system_turns": ([{"role": "system", "content": "Answer in French."},
                      {"role": "user", "content": "Good morning"},
                      {"role": "assistant", "content": "Bonjour"},
                      {"role": "user", "content": "Thank you"}], None),
    "tools": ([{"role": "system", "content": "You can look things up."},
               {"role": "user", "content": "What is the weather in Paris?"}], [WEATHER]),
    "tool_result": ([{"role": "user", "content": "What is the weather in Paris?"},
                     {"role": "assistant", "content": "", "tool_calls": [CALL]},
                     {"role": "tool", "tool_call_id": "call12345", "name": "get_weather",
                      "content": '{"temperature": 21, "sky": "sunny"}'}], [WEATHER]),
}


def _word_tokenizer() -> Tokenizer:
    vocab = {t: i for i, t in enumerate([*SPECIAL.values(), "a", "b"])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return tokenizer


@pytest.fixture(scope="module", params=TEMPLATES, ids=[p.stem for p in TEMPLATES])
def both(request, tmp_path_factory):
    """(transformers' tokenizer, ours) from one folder that transformers saved with the template."""
    folder = tmp_path_factory.mktemp(request.param.stem)
    reference = hf.PreTrainedTokenizerFast(tokenizer_object=_word_tokenizer(), **SPECIAL,
                                           chat_template=request.param.read_text(encoding="utf-8"))
    reference.save_pretrained(folder)
    return hf.AutoTokenizer.from_pretrained(folder), TextTokenizer.from_folder(folder)


def _render(render, messages, tools, generation):
    try:
        return render(messages, tools, generation)
    except (ChatTemplateError, Exception) as exc:  # both must refuse alike
        return f"refused: {type(exc).__name__}"


@pytest.mark.parametrize("generation", [True, False], ids=["generation_prompt", "no_prompt"])
@pytest.mark.parametrize("conversation", list(CONVERSATIONS))
def test_the_template_renders_what_transformers_renders(both, conversation, generation):
    reference, ours = both
    messages, tools = CONVERSATIONS[conversation]
    expected = _render(lambda m, t, g: reference.apply_chat_template(
        m, tools=t, add_generation_prompt=g, tokenize=False), messages, tools, generation)
    got = _render(lambda m, t, g: ours.apply_chat_template(m, tools=t, add_generation_prompt=g),
                  messages, tools, generation)
    if expected.startswith("refused"):  # the template's own raise_exception, e.g. no system role
        assert got == "refused: ChatTemplateError"
    else:
        assert got == expected


def test_most_cases_render_rather_than_refuse(both):
    """The comparison above is of text, not of two refusals: every template renders a plain
    user turn (with tools: a tool_use template iterates over them)."""
    reference, ours = both
    messages = CONVERSATIONS["user"][0]
    assert ours.apply_chat_template(messages, tools=[WEATHER]) == reference.apply_chat_template(
        messages, tools=[WEATHER], tokenize=False, add_generation_prompt=True)


@pytest.mark.parametrize("template", ["Qwen--Qwen2.5-7B-Instruct", "HuggingFaceTB--SmolLM2-135M-Instruct"])
def test_continue_final_message_leaves_the_last_message_open(tmp_path, template):
    text = (Path(__file__).parent / "data" / "templates" / f"{template}.jinja").read_text()
    reference = hf.PreTrainedTokenizerFast(tokenizer_object=_word_tokenizer(), **SPECIAL,
                                           chat_template=text)
    reference.save_pretrained(tmp_path)
    ours = TextTokenizer.from_folder(tmp_path)
    messages = [{"role": "user", "content": "Write JSON."}, {"role": "assistant", "content": '{"a": '}]
    expected = reference.apply_chat_template(messages, tokenize=False, continue_final_message=True)
    assert ours.apply_chat_template(messages, continue_final_message=True) == expected
    assert expected.endswith('{"a": ')


def _folder(tmp_path: Path, config: dict, files: dict[str, str]) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    _word_tokenizer().save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", **SPECIAL, **config}))
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


SIMPLE = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
TOOLS = "{{ tools | length }} tools\n" + SIMPLE
CASES = {
    "config_string": ({"chat_template": SIMPLE}, {}),
    "config_list": ({"chat_template": [{"name": "default", "template": SIMPLE},
                                       {"name": "tool_use", "template": TOOLS}]}, {}),
    "jinja_file_wins": ({"chat_template": "config: " + SIMPLE}, {"chat_template.jinja": SIMPLE}),
    "named_files": ({}, {"chat_template.jinja": SIMPLE,
                         "additional_chat_templates/tool_use.jinja": TOOLS}),
    "named_files_win": ({"chat_template": "config: " + SIMPLE},
                        {"additional_chat_templates/tool_use.jinja": TOOLS}),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("tools", [None, [WEATHER]], ids=["no_tools", "tools"])
def test_templates_are_found_and_chosen_as_transformers_does(tmp_path, case, tools):
    folder = _folder(tmp_path, *CASES[case])
    messages = CONVERSATIONS["turns"][0]
    expected = _render(lambda m, t, g: hf.AutoTokenizer.from_pretrained(folder).apply_chat_template(
        m, tools=t, add_generation_prompt=g, tokenize=False), messages, tools, True)
    got = _render(lambda m, t, g: TextTokenizer.from_folder(folder).apply_chat_template(
        m, tools=t, add_generation_prompt=g), messages, tools, True)
    assert got == expected if not expected.startswith("refused") else got.startswith("refused")


def test_named_templates_travel_with_the_files(tmp_path):
    folder = _folder(tmp_path / "in", *CASES["named_files"])
    ours = TextTokenizer.from_folder(folder)
    assert sorted(ours.chat_templates) == ["default", "tool_use"]
    saved = ours.save(tmp_path / "out")
    assert "additional_chat_templates/tool_use.jinja" in saved
    again = TextTokenizer.from_folder(tmp_path / "out")
    assert again.chat_templates == ours.chat_templates
    assert again.apply_chat_template([{"role": "user", "content": "x"}], chat_template="tool_use",
                                     tools=[WEATHER]) == "1 tools\nuser: x\n"


def test_a_model_without_a_template_says_so(tmp_path):
    ours = TextTokenizer.from_folder(_folder(tmp_path, {}, {}))
    with pytest.raises(ChatTemplateError, match="has no chat template"):
        ours.apply_chat_template([{"role": "user", "content": "hi"}])
    with pytest.raises(ChatTemplateError, match="names no template"):
        TextTokenizer.from_folder(_folder(tmp_path / "n", *CASES["named_files"])).apply_chat_template(
            [{"role": "user", "content": "hi"}], chat_template="nope")


def test_special_tokens_are_read_as_transformers_reads_them(tmp_path):
    """tokenizer_config.json's, overridden by special_tokens_map.json when the config has no
    added_tokens_decoder (the legacy rule)."""
    folder = _folder(tmp_path, {"chat_template": "{{ bos_token }}|{{ eos_token }}|{{ pad_token }}"}, {})
    (folder / "special_tokens_map.json").write_text(json.dumps({"bos_token": "<unk>"}))
    expected = hf.AutoTokenizer.from_pretrained(folder).apply_chat_template(
        [{"role": "user", "content": "x"}], tokenize=False)
    assert TextTokenizer.from_folder(folder).apply_chat_template(
        [{"role": "user", "content": "x"}], add_generation_prompt=False) == expected
