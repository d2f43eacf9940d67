"""The chat checkpoint of tests/chat/checkpoint.py, loaded by the kit and by transformers, and
exported, once per test process."""

from __future__ import annotations

import pytest
import transformers as hf

import transformer_kit as tk
from tests.chat.checkpoint import write_chat_checkpoint
from transformer_kit.export import export_onnx
from transformer_kit.runtime import OnnxModel


@pytest.fixture(scope="session")
def chat_checkpoint(tmp_path_factory):
    """(folder, the kit's model, its OnnxModel, transformers' model, transformers' tokenizer)."""
    folder = write_chat_checkpoint(tmp_path_factory.mktemp("chat") / "qwen2")
    model = tk.from_hf(folder)
    export_onnx(model, folder / "onnx")
    return (folder, model, OnnxModel(folder / "onnx", providers="cpu"),
            hf.AutoModelForCausalLM.from_pretrained(folder).eval(), hf.AutoTokenizer.from_pretrained(folder))
