"""sentence-transformers folders (written with its own save) give ``SentenceTransformer.encode``'s
embeddings in PyTorch and onnxruntime, and cross-encoders ``CrossEncoder.predict``'s scores:
each pooling mode, with and without Dense and Normalize, BERT and RoBERTa bodies, padded
batches run sorted by length, prompts, truncation."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("sentence_transformers")

import transformer_kit as tk
from tests.core.embedding.checkpoints import write_cross_encoder, write_sentence_transformer
from transformer_kit.export import export_onnx
from transformer_kit.runtime import OnnxModel

TEXTS = ["hello world", "The quick brown fox jumps over the lazy dog, and then some more words "
         "about search engines ranking documents by relevance to a query.", "Paris",
         "embeddings map text to vectors", "cats and dogs " * 40]  # the last one is cut

CASES = {  # one per pooling mode; bodies, Dense, Normalize and include_prompt varied among them
    "mean-bert": dict(pooling="mean"),
    "cls-roberta-dense-normalize": dict(body="roberta", pooling="cls", dense=16, normalize=True),
    "max-bert-normalize": dict(pooling="max", normalize=True),
    "mean_sqrt_len-roberta": dict(body="roberta", pooling="mean_sqrt_len_tokens"),
    "weightedmean-bert-dense-no-prompt": dict(pooling="weightedmean", dense=24, include_prompt=False),
    "lasttoken-roberta-normalize": dict(body="roberta", pooling="lasttoken", normalize=True),
}


@pytest.fixture(scope="module", params=list(CASES))
def embedder(request, tmp_path_factory):
    """(sentence-transformers reference, kit PyTorch model, OnnxModel) of one case."""
    root = tmp_path_factory.mktemp(request.param)
    reference = write_sentence_transformer(root / "st", **CASES[request.param])
    model = tk.from_hf(root / "st")
    export_onnx(model, root / "onnx")
    return reference, model, OnnxModel(root / "onnx")


@pytest.mark.parametrize("prompt_name", [None, "query"])
def test_embeddings_equal_sentence_transformers(embedder, prompt_name):
    reference, model, om = embedder
    expected = reference.encode(TEXTS, prompt_name=prompt_name)
    for runtime in (model, om):  # batch_size 2: three padded batches, sorted by length
        got = runtime.embed(TEXTS, prompt_name=prompt_name, batch_size=2)
        assert got.shape == expected.shape and got.dtype == np.float32
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)


def test_token_ids_give_the_texts_vectors(embedder):
    _, model, om = embedder
    ids = om.sentences.encode_inputs(TEXTS[:3]).tokens
    np.testing.assert_allclose(om.embed(ids), om.embed(TEXTS[:3]), rtol=0, atol=1e-6)
    np.testing.assert_allclose(model.embed(ids[0]), om.embed(TEXTS[0]), rtol=0, atol=1e-5)


def test_dimensions_cut_and_normalize(embedder):
    reference, _, om = embedder
    full = reference.encode(TEXTS[:3])
    cut = om.embed(TEXTS[:3], dimensions=8, normalize=True)
    expected = full[:, :8] / np.linalg.norm(full[:, :8], axis=1, keepdims=True)
    np.testing.assert_allclose(cut, expected, rtol=0, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(cut, axis=1), 1.0, atol=1e-6)


@pytest.mark.parametrize("case", [dict(), dict(body="roberta"), dict(num_labels=3)],
                         ids=["bert-token-types", "xlm-roberta", "three-labels"])
def test_cross_encoder_scores_equal_predict(case, tmp_path):
    reference = write_cross_encoder(tmp_path / "ce", **case)
    query, documents = "what is the capital of france", TEXTS
    expected = reference.predict([(query, d) for d in documents])
    model = tk.from_hf(tmp_path / "ce")
    export_onnx(model, tmp_path / "onnx")
    om = OnnxModel(tmp_path / "onnx")
    for runtime in (model, om):
        np.testing.assert_allclose(runtime.score(query, documents, batch_size=2), expected,
                                   rtol=0, atol=1e-5)
    if case.get("num_labels", 1) == 1:
        ranked = om.rerank(query, documents, top_n=3, return_documents=True)
        order = np.argsort(-expected, kind="stable")[:3]
        assert [r.index for r in ranked] == order.tolist()
        np.testing.assert_allclose([r.score for r in ranked], expected[order], atol=1e-5)
        assert [r.document for r in ranked] == [documents[i] for i in order]
    else:
        with pytest.raises(tk.InputError, match="3 labels"):
            om.rerank(query, documents)


def test_int8_keeps_the_direction(tmp_path):
    """int8 weights (the Dense layer's too): vectors within cosine 0.99 of float32 on average."""
    write_sentence_transformer(tmp_path / "st", pooling="mean", dense=16, normalize=True)
    model = tk.from_hf(tmp_path / "st")
    export_onnx(model, tmp_path / "f32")
    export_onnx(model, tmp_path / "int8", quantize="int8")
    exact, quantized = OnnxModel(tmp_path / "f32").embed(TEXTS), OnnxModel(tmp_path / "int8").embed(TEXTS)
    cosine = (exact * quantized).sum(axis=1)  # both normalised
    assert cosine.mean() >= 0.99, cosine


def test_int8_cross_encoder_keeps_the_ranking(tmp_path):
    reference = write_cross_encoder(tmp_path / "ce")
    export_onnx(tk.from_hf(tmp_path / "ce"), tmp_path / "int8", quantize="int8")
    expected = reference.predict([("capital of france", d) for d in TEXTS])
    scores = OnnxModel(tmp_path / "int8").score("capital of france", TEXTS)
    np.testing.assert_allclose(scores, expected, atol=0.02)


def test_a_saved_model_in_training_mode_embeds_as_sentence_transformers(embedder, tmp_path):
    """save / load_model keep the pipeline and the tokenizer; embed runs without dropout
    whatever the model's mode."""
    reference, model, _ = embedder
    model.save(tmp_path / "saved")
    loaded = tk.load_model(tmp_path / "saved").train()
    np.testing.assert_allclose(loaded.embed(TEXTS, prompt_name="query"),
                               reference.encode(TEXTS, prompt_name="query"), atol=1e-5)
    assert loaded.training
