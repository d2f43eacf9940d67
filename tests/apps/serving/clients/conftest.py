"""Shared by the client tests: the chat checkpoint of tests/chat/checkpoint.py (a random Qwen2,
ChatML, the Qwen2.5 template) exported once a session, and its server on 127.0.0.1, which each
client module points its real client at; the references are the same export's own greedy
replies (``OnnxModel.chat``) and transformers on the same checkpoint."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import transformers as hf

import transformer_kit as tk
from tests.apps.serving.conftest import record_prompts
from tests.chat.checkpoint import TEMPLATES, write_chat_checkpoint
from transformer_kit.apps.serving.http import create_app
from transformer_kit.apps.serving.http import serve_in_thread as running
from transformer_kit.export import export_onnx
from transformer_kit.runtime import Engine, OnnxModel

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}},
                   "required": ["city"]}}}


@dataclass
class Served:
    """A server on 127.0.0.1 over an export: its base URL (``/v1`` under it), the model name
    clients send, the checkpoint folder (transformers' reference, a tokenizer for clients that
    count tokens), the export, and the prompts its engine was given, in order."""

    url: str
    name: str
    checkpoint: Path
    model: OnnxModel
    prompts: list[list[int]]

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def prompt_ids(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        """The ids of the turn transformers' chat template renders for ``messages``, encoded by
        the export's tokenizer (transformers 5 reads this tokenizer as Qwen2's, whose
        pre-tokenizer splits digits apart; tokenizer.json, which the kit keeps, does not)."""
        tokenizer = hf.AutoTokenizer.from_pretrained(self.checkpoint)
        text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                             add_generation_prompt=True)
        return self.model.tokenizer.encode([text], add_special_tokens=False)[0][0].tolist()

    def reply(self, messages: list[dict], max_tokens: int, **options) -> dict:
        """The export's own greedy reply (``OnnxModel.chat``), with its ``prompt_tokens``: the
        reference a client's answer is held to."""
        reply = self.model.chat(messages, max_new_tokens=max_tokens, **options)
        return {**reply, "prompt_tokens": len(self.prompt_ids(messages, options.get("tools")))}


@pytest.fixture(scope="session")
def chat_checkpoint(tmp_path_factory) -> tuple[Path, OnnxModel]:
    """(the checkpoint folder, its export in onnxruntime)."""
    folder = write_chat_checkpoint(tmp_path_factory.mktemp("clients") / "qwen2")
    export_onnx(tk.from_hf(folder), folder / "onnx")
    return folder, OnnxModel(folder / "onnx", providers="cpu")


def _serve(folder: Path, om: OnnxModel, name: str):
    engine = Engine(om, max_batch=8, max_queue=64)
    prompts = record_prompts(engine)
    with running(create_app(engine, name)) as url:
        yield Served(url, name, folder, om, prompts)
    engine.close()


@pytest.fixture(scope="session")
def chat_server(chat_checkpoint):
    """The chat export served as "chat"."""
    folder, om = chat_checkpoint
    yield from _serve(folder, om, "chat")


@pytest.fixture(scope="session")
def smollm_server(chat_checkpoint):
    """A copy of the export whose chat template is SmolLM2's, which renders no tools, served
    as "smollm"."""
    folder, _ = chat_checkpoint
    copy = folder.parent / "smollm"
    shutil.copytree(folder / "onnx", copy)
    template = (TEMPLATES / "HuggingFaceTB--SmolLM2-135M-Instruct.jinja").read_text(encoding="utf-8")
    (copy / "chat_template.jinja").write_text(template, encoding="utf-8")
    yield from _serve(folder, OnnxModel(copy, providers="cpu"), "smollm")


@pytest.fixture(scope="session")
def embedding_server(embedding_export):
    """The sentence-transformers model of tests/apps/conftest.py served as "tiny-embed":
    (its url, the ``SentenceTransformer``, the reference)."""
    st, om = embedding_export
    engine = Engine(om)
    with running(create_app(engine, "tiny-embed")) as url:
        yield url, st
    engine.close()
