"""transformer-kit rerank: CrossEncoder's scores, best first, from an export folder."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("sentence_transformers")

import transformer_kit as tk
from tests.apps.conftest import invoke
from tests.core.embedding.checkpoints import write_cross_encoder
from transformer_kit.export import export_onnx

TEXTS = ["hello world", "search engines rank documents", "Paris"]


def test_rerank_orders_by_cross_encoder_scores(tmp_path):
    reference = write_cross_encoder(tmp_path / "ce")
    export_onnx(tk.from_hf(tmp_path / "ce"), tmp_path / "onnx")
    flags = [x for t in TEXTS for x in ("--document", t)]
    result = invoke("rerank", str(tmp_path / "onnx"), "--query", "capital of france", *flags)
    assert result.exit_code == 0, result.output
    scores = reference.predict([("capital of france", t) for t in TEXTS])
    rows = [line.split(maxsplit=2) for line in result.output.strip().splitlines()]
    assert [int(r[1]) for r in rows] == np.argsort(-scores, kind="stable").tolist()
    np.testing.assert_allclose([float(r[0]) for r in rows], np.sort(scores)[::-1], atol=1e-5)


def test_rerank_of_an_embedding_model_names_the_missing_classifier(tmp_path):
    from tests.core.embedding.checkpoints import write_sentence_transformer

    write_sentence_transformer(tmp_path / "st")
    result = invoke("rerank", str(tmp_path / "st"), "--query", "q", "--document", "d")
    assert result.exit_code == 1 and "no classifier" in result.output
