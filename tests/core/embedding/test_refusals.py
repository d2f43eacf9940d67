"""Bad inputs to embed, score and rerank, and folders the kit cannot build, are refused with
typed errors that say what was given and what to do."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

pytest.importorskip("sentence_transformers")

import transformer_kit as tk
from tests.core.embedding.checkpoints import write_cross_encoder, write_sentence_transformer


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("refusals")
    write_sentence_transformer(root / "st", pooling="mean")
    write_cross_encoder(root / "ce")
    return root


@pytest.mark.parametrize("inputs, options, message", [
    ([], {}, "empty list"),
    ([1, "a"], {}, "mixing types"),
    ([[1, 2], []], {}, "non-empty id lists"),
    ([[1, 10**6]], {}, "outside the vocabulary"),
    (["a"], {"prompt_name": "nope"}, "prompt_name 'nope' is not one of"),
    (["a"], {"prompt": "x", "prompt_name": "query"}, "not both"),
    ([[5, 6]], {"prompt_name": "query"}, "token ids"),
    (["a"], {"dimensions": 0}, "dimensions must be an integer from 1 to 32"),
    (["a"], {"batch_size": 0}, "batch_size must be a positive integer"),
])
def test_embed_refusals(folders, inputs, options, message):
    model = tk.from_hf(folders / "st")
    with pytest.raises(tk.InputError, match=message):
        model.embed(inputs, **options)


def test_wrong_head_is_named(folders):
    embedder, cross_encoder = tk.from_hf(folders / "st"), tk.from_hf(folders / "ce")
    with pytest.raises(tk.InputError, match="no classifier"):
        embedder.rerank("q", ["d"])
    with pytest.raises(tk.InputError, match="no sentence embedding"):
        cross_encoder.embed(["text"])
    with pytest.raises(tk.InputError, match="documents must be a list of strings"):
        cross_encoder.rerank("q", "one string")
    with pytest.raises(tk.InputError, match="top_n"):
        cross_encoder.rerank("q", ["d"], top_n=0)
    assert cross_encoder.rerank("q", []) == []


def _concatenated_modes(root):
    (root / "1_Pooling" / "config.json").write_text(json.dumps(
        {"embedding_dimension": 32, "pooling_mode": ["cls", "mean"]}))


def _layer_norm_module(root):
    modules = json.loads((root / "modules.json").read_text())
    modules.append({"idx": 2, "name": "2", "path": "2_LayerNorm",
                    "type": "sentence_transformers.models.LayerNorm"})
    (root / "modules.json").write_text(json.dumps(modules))


@pytest.mark.parametrize("edit, message", [
    (_concatenated_modes, "concatenated modes"),
    (_layer_norm_module, "LayerNorm' is not supported"),
    (lambda root: (root / "modules.json").write_text("[{"), "not valid JSON"),
])
def test_unsupported_folders_are_refused(folders, tmp_path, edit, message):
    root = tmp_path / "st"
    shutil.copytree(folders / "st", root)
    edit(root)
    with pytest.raises(tk.CheckpointError, match=message):
        tk.from_hf(root)


def test_legacy_layout_with_lowercase_and_limit(folders, tmp_path):
    """sentence-transformers 2's files: pooling_mode_*_token flags, max_seq_length and
    do_lower_case in sentence_bert_config.json, read by sentence-transformers 6 the same way."""
    from sentence_transformers import SentenceTransformer

    root = tmp_path / "st"
    shutil.copytree(folders / "st", root)
    (root / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": 32, "pooling_mode_cls_token": False,
        "pooling_mode_mean_tokens": False, "pooling_mode_max_tokens": True}))
    (root / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 9,
                                                                "do_lower_case": True}))
    texts = ["Hello World, This Is A Longer Text Than Nine Tokens For Sure", "PARIS"]
    expected = SentenceTransformer(str(root), device="cpu").encode(texts)
    model = tk.from_hf(root)
    assert model.config.max_seq_length == 9 and model.config.lowercase
    np.testing.assert_allclose(model.embed(texts), expected, atol=1e-5)
