"""Shared by the serving tests: the tiny decoder's export in onnxruntime."""

from __future__ import annotations

import pytest

from transformer_kit.export import OnnxModel


@pytest.fixture(scope="session")
def onnx_model(exported) -> OnnxModel:
    _, folder = exported
    return OnnxModel(folder / "onnx", providers="cpu")



def _export(model, folder) -> OnnxModel:
    from transformer_kit.export import export_onnx

    export_onnx(model, folder)
    return OnnxModel(folder, providers="cpu")


@pytest.fixture(scope="session")
def embedding_export(tmp_path_factory):
    """A random sentence-transformers model (BERT body, mean pooling, Normalize, 24 tokens per
    input) written by sentence-transformers, read by from_hf and exported: (the
    ``SentenceTransformer``, the reference; its ``OnnxModel``)."""
    import transformer_kit as tk
    from tests.embedding.checkpoints import write_sentence_transformer

    folder = tmp_path_factory.mktemp("embeddings")
    reference = write_sentence_transformer(folder / "st", normalize=True, max_seq_length=24)
    return reference, _export(tk.from_hf(folder / "st"), folder / "onnx")


@pytest.fixture(scope="session")
def cross_encoder_export(tmp_path_factory):
    """A random one-label cross-encoder (BERT body, 24 tokens per pair) written by
    sentence-transformers, read by from_hf and exported: (the ``CrossEncoder``, the reference;
    its ``OnnxModel``)."""
    import transformer_kit as tk
    from tests.embedding.checkpoints import write_cross_encoder

    folder = tmp_path_factory.mktemp("rerank")
    reference = write_cross_encoder(folder / "ce", max_length=24)
    return reference, _export(tk.from_hf(folder / "ce"), folder / "onnx")
