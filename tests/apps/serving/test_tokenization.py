"""``POST /tokenize``, ``POST /detokenize`` and ``GET /tokenizer_info`` (vLLM's) over the chat checkpoint of
tests/chat/checkpoint.py: ids equal the export's tokenizer.json (through the ``tokenizers``
library) on the text transformers' chat template renders, and the prompt a chat request is
given; text back as the tokenizer decodes it; the tokenizer's configuration as vLLM gives
the one transformers loads, and ``/v1/models``' entry as vLLM's; the API key and bad input as
the other endpoints."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
import transformers as hf
from tokenizers import Tokenizer

import transformer_kit as tk
from tests.chat.checkpoint import write_chat_checkpoint
from transformer_kit.apps.serving.http import create_app
from transformer_kit.apps.serving.http import serve_in_thread as running
from transformer_kit.export import export_onnx
from transformer_kit.runtime import Engine, OnnxModel

MESSAGES = [{"role": "system", "content": "Answer in a few words."},
            {"role": "user", "content": "What is the weather in Paris? café 日本"}]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(base URL, the export's tokenizer.json, transformers' tokenizer, the OnnxModel); the
    server needs the key "sesame"."""
    folder = write_chat_checkpoint(tmp_path_factory.mktemp("tokenize") / "qwen2")
    export_onnx(tk.from_hf(folder), folder / "onnx")
    om = OnnxModel(folder / "onnx", providers="cpu")
    engine = Engine(om, max_batch=4)
    with running(create_app(engine, "chat", api_key="sesame")) as url:
        yield (url, Tokenizer.from_file(str(folder / "onnx" / "tokenizer.json")),
               hf.AutoTokenizer.from_pretrained(folder), om)
    engine.close()


#: The entries of transformers' ``init_kwargs`` that describe the loading, not the tokenizer
#: (a config saved by transformers 5 holds some of them too), and the loaded class.
LOADER = ("name_or_path", "is_local", "local_files_only", "backend", "tokenizer_class")


def vllm_tokenizer_info(folder) -> tuple[dict, dict]:
    """What vLLM's /tokenizer_info gives for the tokenizer transformers loads from ``folder``:
    its ``init_kwargs`` without vocab_file and merges_file, each AddedToken as its text, as JSON
    (vLLM's TokenizerInfo). Split into (the settings, the loader's own entries: the folder's
    path, its flags, and the loaded class, which these tests check apart)."""
    tokenizer = hf.AutoTokenizer.from_pretrained(folder)

    def plain(value):
        if hasattr(value, "content"):
            return value.content
        if isinstance(value, dict):
            return {key: plain(item) for key, item in value.items()}
        return [plain(item) for item in value] if isinstance(value, list) else value

    config = {key: value for key, value in tokenizer.init_kwargs.items()
              if key not in ("vocab_file", "merges_file")}
    info = json.loads(json.dumps(plain(config)))
    return ({k: v for k, v in info.items() if k not in LOADER},
            {k: v for k, v in info.items() if k in LOADER})


def test_tokenizer_info_is_vllms_over_the_tokenizer_transformers_loads(served):
    url, reference, hf_tok, om = served
    info = _get(url, "/tokenizer_info").json()
    expected, loader_only = vllm_tokenizer_info(om.path)
    assert set(loader_only) <= {"name_or_path", "is_local", "local_files_only", "backend"}
    assert {key: value for key, value in info.items() if key not in LOADER} == expected
    assert info["chat_template"] == hf_tok.chat_template and "<|im_start|>" in info["chat_template"]
    assert info["eos_token"] == "<|im_end|>" and info["added_tokens_decoder"]["2"] == "<|im_end|>"
    loaded = getattr(hf, info["tokenizer_class"]).from_pretrained(om.path)  # the class it names loads it
    assert loaded.encode(MESSAGES[1]["content"]) == reference.encode(MESSAGES[1]["content"]).ids
    assert _get(url, "/tokenizer_info", key=None).status_code == 401
    card = _get(url, "/v1/models").json()["data"][0]
    assert card == {"id": "chat", "object": "model", "created": card["created"],
                    "owned_by": "transformer-kit", "root": str(om.path.resolve()), "parent": None,
                    "max_model_len": om.context_length, "generation_defaults": {}}


def _get(url: str, path: str, key: str | None = "sesame") -> httpx.Response:
    headers = {} if key is None else {"Authorization": f"Bearer {key}"}
    return httpx.get(f"{url}{path}", headers=headers, timeout=60)


def _post(url: str, path: str, body: dict, key: str | None = "sesame") -> httpx.Response:
    headers = {} if key is None else {"Authorization": f"Bearer {key}"}
    return httpx.post(f"{url}{path}", json=body, headers=headers, timeout=60)


def test_a_prompt_tokenizes_as_the_exports_tokenizer(served):
    url, reference, _, om = served
    text = "The weather in Paris is sunny, 21 degrees. café naïve 🙂"
    answer = _post(url, "/tokenize", {"model": "chat", "prompt": text}).json()
    expected = reference.encode(text).ids
    assert answer == {"count": len(expected), "max_model_len": om.context_length, "tokens": expected}
    with_strings = _post(url, "/tokenize", {"prompt": text, "return_token_strs": True}).json()
    assert with_strings["token_strs"] == [reference.id_to_token(i) for i in expected]


def test_messages_tokenize_as_the_chat_prompt_a_request_is_given(served):
    url, reference, hf_tok, _ = served
    answer = _post(url, "/tokenize", {"model": "chat", "messages": MESSAGES}).json()
    rendered = hf_tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert answer["tokens"] == reference.encode(rendered, add_special_tokens=False).ids
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="sesame", max_retries=0, timeout=60)
    chat = client.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=2, temperature=0)
    assert chat.usage.prompt_tokens == answer["count"]
    bare = _post(url, "/tokenize", {"messages": MESSAGES, "add_generation_prompt": False}).json()
    rendered = hf_tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=False)
    assert bare["tokens"] == reference.encode(rendered, add_special_tokens=False).ids != answer["tokens"]


def test_detokenize_gives_the_text_back(served):
    url, reference, _, _ = served
    text = "Tell me about café culture. 日本"
    ids = _post(url, "/tokenize", {"prompt": text}).json()["tokens"]
    assert _post(url, "/detokenize", {"model": "chat", "tokens": ids}).json() == {"prompt": text}
    chat_ids = _post(url, "/tokenize", {"messages": MESSAGES}).json()["tokens"]
    assert (_post(url, "/detokenize", {"tokens": chat_ids}).json()["prompt"]
            == reference.decode(chat_ids, skip_special_tokens=True))


BAD = {
    "an id past the vocabulary": ("/detokenize", {"tokens": [5, 100000]}, "tokens[1] is 100000"),
    "a negative id": ("/detokenize", {"tokens": [-1]}, "tokens[0] is -1"),
    "a string id": ("/detokenize", {"tokens": ["5"]}, "tokens.0"),
    "a fractional id": ("/detokenize", {"tokens": [1.5]}, "tokens.0"),
    "a boolean id": ("/detokenize", {"tokens": [True]}, "tokens.0"),
    "no tokens": ("/detokenize", {}, "tokens"),
    "prompt and messages": ("/tokenize", {"prompt": "hi", "messages": MESSAGES}, "has both"),
    "neither": ("/tokenize", {"model": "chat"}, "has neither"),
    "a prompt that is not text": ("/tokenize", {"prompt": [1, 2]}, "prompt"),
    "an unknown field": ("/tokenize", {"prompt": "hi", "promt": "x"}, "Unknown field 'promt'"),
    "an unknown role": ("/tokenize", {"messages": [{"role": "wizard", "content": "x"}]}, "wizard"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_400_with_a_sentence_and_the_server_keeps_serving(served, case):
    url, reference, _, _ = served
    path, body, named = BAD[case]
    response = _post(url, path, body)
    assert response.status_code == 400, response.text
    assert named in response.json()["error"]["message"]
    assert _post(url, "/tokenize", {"prompt": "hi"}).json()["tokens"] == reference.encode("hi").ids


def test_an_unknown_model_is_404_and_the_key_is_needed(served):
    url, _, _, _ = served
    assert _post(url, "/tokenize", {"model": "other", "prompt": "hi"}).status_code == 404
    assert _post(url, "/detokenize", {"tokens": [1]}, key=None).status_code == 401
    assert _post(url, "/tokenize", {"prompt": "hi"}, key="wrong").status_code == 401
