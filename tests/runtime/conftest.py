"""The runtime's one-shot text work checked against transformers on random checkpoints made by
the other tests' fixtures: the command tests' GPT-2 with a byte-level BPE (text generation), and
the chat checkpoint of tests/chat/checkpoint.py (a conversation)."""

from __future__ import annotations

import pytest
import transformers as hf

from tests.apps.conftest import text_export  # noqa: F401  (the fixtures, shared)
from tests.chat.conftest import chat_checkpoint  # noqa: F401
from transformer_kit.runtime import OnnxModel


@pytest.fixture(scope="session")
def gpt2_text(text_export):  # noqa: F811
    """(transformers' GPT-2 with random weights, the OnnxModel of its export with tokenizer.json,
    transformers' fast tokenizer of the same tokenizer.json)."""
    folder = text_export.parent
    return (hf.GPT2LMHeadModel.from_pretrained(folder).eval(), OnnxModel(text_export, providers="cpu"),
            hf.PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json")))
