"""The bert family: BertModel checkpoints (last hidden state) equal transformers in PyTorch and
onnxruntime."""

from __future__ import annotations

from typing import ClassVar

import transformers as hf

from tests.plugins.families import parity


def _bert(hidden, heads, layers, **extra):
    return hf.BertModel(hf.BertConfig(
        vocab_size=parity.VOCAB, hidden_size=hidden, num_attention_heads=heads,
        num_hidden_layers=layers, intermediate_size=2 * hidden + 3, max_position_embeddings=40,
        **extra), add_pooling_layer=False)


class TestBert(parity.FamilyParity):
    CHECKPOINTS: ClassVar = {
        "bert-3heads-1layer": lambda: _bert(12, 3, 1),
        "bert-5heads-3layers": lambda: _bert(20, 5, 3, type_vocab_size=3),
    }
