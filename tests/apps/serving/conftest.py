"""Shared by the serving tests: the tiny decoder's export in onnxruntime."""

from __future__ import annotations

import pytest

from transformer_kit.export import OnnxModel


@pytest.fixture(scope="session")
def onnx_model(exported) -> OnnxModel:
    _, folder = exported
    return OnnxModel(folder / "onnx", providers="cpu")


def _encoder_export(folder, kind: str):
    """A tiny BERT-shaped encoder with the sentence-transformers folder's tokenizer, exported:
    mean pooling and normalisation (kind "embeddings") or a one-label classifier ("rerank").
    Returns (the PyTorch model, its OnnxModel)."""
    import torch

    import transformer_kit as tk
    from tests.embedding.checkpoints import write_sentence_transformer
    from transformer_kit.config import config_from_dict
    from transformer_kit.decoding.text import TextTokenizer
    from transformer_kit.export import export_onnx

    write_sentence_transformer(folder / "st")
    tokenizer = TextTokenizer.from_folder(folder / "st")
    head = ({"pooling": "mean", "sentence_embedding": {"normalize": True}} if kind == "embeddings"
            else {"classifier": {"num_labels": 1}})
    torch.manual_seed(0)
    model = tk.build_model(config_from_dict({
        "architecture": "encoder", "vocab_size": tokenizer.backend.get_vocab_size(), "d_model": 32,
        "num_heads": 4, "num_layers": 2, "d_ff": 64, "attention": "sdpa", "pad_id": 0,
        "positional": {"name": "learned", "token_types": 2}, "max_seq_length": 24, **head})).eval()
    model.tokenizer = tokenizer
    export_onnx(model, folder / "onnx")
    return model, OnnxModel(folder / "onnx", providers="cpu")


@pytest.fixture(scope="session")
def embedding_export(tmp_path_factory):
    """(PyTorch model, OnnxModel) of a tiny sentence-embedding model (24 tokens per input)."""
    return _encoder_export(tmp_path_factory.mktemp("embeddings"), "embeddings")


@pytest.fixture(scope="session")
def cross_encoder_export(tmp_path_factory):
    """(PyTorch model, OnnxModel) of a tiny one-label cross-encoder (24 tokens per pair)."""
    return _encoder_export(tmp_path_factory.mktemp("rerank"), "rerank")
