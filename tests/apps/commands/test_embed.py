"""transformer-kit embed: sentence-transformers' vectors from an export folder (made by
``export --from-hf``) and from the checkpoint folder itself; .npy written whole."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("sentence_transformers")

from tests.apps.conftest import invoke
from tests.core.embedding.checkpoints import write_sentence_transformer

TEXTS = ["hello world", "search engines rank documents", "Paris"]


@pytest.fixture(scope="module")
def embedder(tmp_path_factory):
    root = tmp_path_factory.mktemp("embed")
    reference = write_sentence_transformer(root / "st", pooling="mean", dense=24, normalize=True)
    result = invoke("export", str(root / "st"), "--from-hf", "-o", str(root / "onnx"))
    assert result.exit_code == 0, result.output  # the command keeps the whole pipeline
    assert "sentence outputs" in result.output
    return reference, root


@pytest.mark.parametrize("source", ["onnx", "st"])
def test_embed_writes_sentence_transformers_vectors(embedder, source, tmp_path):
    reference, root = embedder
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS[1:]) + "\n\n", encoding="utf-8")
    out = tmp_path / "out" / "vectors.npy"
    result = invoke("embed", str(root / source), "--text", TEXTS[0], "--file", str(texts),
                    "--prompt-name", "query", "-o", str(out))
    assert result.exit_code == 0, result.output
    np.testing.assert_allclose(np.load(out), reference.encode(TEXTS, prompt_name="query"), atol=1e-5)


def test_embed_prints_rows(embedder):
    reference, root = embedder
    result = invoke("embed", str(root / "onnx"), "--text", TEXTS[2], "--dimensions", "4")
    assert result.exit_code == 0, result.output
    printed = np.array([float(v) for v in result.output.splitlines()[0].split()])
    expected = reference.encode([TEXTS[2]])[0, :4]
    expected /= np.linalg.norm(expected)  # a normalising model's cut vectors are normalised again
    np.testing.assert_allclose(printed, expected, atol=1e-5)


def test_embed_refusals_leave_no_file(embedder, tmp_path):
    _, root = embedder
    assert invoke("embed", str(root / "onnx")).exit_code != 0  # no text
    result = invoke("embed", str(root / "onnx"), "--text", "a", "--prompt-name", "nope",
                    "-o", str(tmp_path / "v.npy"))
    assert result.exit_code == 1 and "prompt_name 'nope'" in result.output
    result = invoke("embed", str(root / "onnx"), "--text", "a", "-o", str(tmp_path / "v.txt"))
    assert result.exit_code == 1 and ".npy" in result.output
    assert list(tmp_path.iterdir()) == []
