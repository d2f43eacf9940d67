"""Shared by the command tests: typer's runner, a real subprocess, a saved and exported model,
an export with a tokenizer; and (with the serving tests) a sentence-embedding model's and a
cross-encoder's exports."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

import transformer_kit as tk
from tests.combinations import tiny_config
from transformer_kit.apps.cli import app

runner = CliRunner()


def invoke(*args: str):
    """The command in this process (typer's runner); stdout and stderr together in .output."""
    return runner.invoke(app, list(args), env={"COLUMNS": "200"})


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """The command in a real process, as a user runs it (``python -m transformer_kit``); its
    output unbuffered, so a command stopped by the timeout shows how far it got."""
    env = {**os.environ, "COLUMNS": "200", "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "transformer_kit", *args], capture_output=True,
                          text=True, cwd=cwd, env=env, timeout=600, check=False)


def config_file(folder: Path, architecture: str = "decoder", **overrides) -> Path:
    """A tiny model's config as YAML (a decoder unless said otherwise)."""
    path = folder / "model.yaml"
    path.write_text(yaml.safe_dump(tiny_config(architecture, **overrides)))
    return path


@pytest.fixture(scope="session")
def exported(tmp_path_factory):
    """A saved tiny decoder (folder/model) and its export (folder/onnx), shared by the tests."""
    folder = tmp_path_factory.mktemp("cli")
    torch.manual_seed(0)
    model = tk.build_model(tiny_config("decoder", attention="sdpa"))
    model.save(folder / "model")
    result = invoke("export", str(folder / "model"), "-o", str(folder / "onnx"))
    assert result.exit_code == 0, result.output
    return model.eval(), folder


@pytest.fixture(scope="session")
def text_export(tmp_path_factory):
    """An export with a tokenizer (a random GPT-2 with a byte-level BPE): text in, text out."""
    import transformers as hf

    from tests.core.decoding.test_text import VOCAB, byte_level_tokenizer
    from transformer_kit.export import export_onnx

    folder = tmp_path_factory.mktemp("cli-text")
    torch.manual_seed(0)
    hf.GPT2LMHeadModel(hf.GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=32, n_head=4,
                                     n_layer=2, bos_token_id=1, eos_token_id=2,
                                     initializer_range=0.2)).save_pretrained(folder)
    byte_level_tokenizer().save(str(folder / "tokenizer.json"))
    export_onnx(tk.from_hf(folder), folder / "onnx")
    return folder / "onnx"


def _export(model, folder):
    from transformer_kit.export import export_onnx
    from transformer_kit.runtime import OnnxModel

    export_onnx(model, folder)
    return OnnxModel(folder, providers="cpu")


@pytest.fixture(scope="session")
def embedding_export(tmp_path_factory):
    """A random sentence-transformers model (BERT body, mean pooling, Normalize, 24 tokens per
    input) written by sentence-transformers, read by from_hf and exported: (the
    ``SentenceTransformer``, the reference; its ``OnnxModel``)."""
    from tests.core.embedding.checkpoints import write_sentence_transformer

    folder = tmp_path_factory.mktemp("embeddings")
    reference = write_sentence_transformer(folder / "st", normalize=True, max_seq_length=24)
    return reference, _export(tk.from_hf(folder / "st"), folder / "onnx")


@pytest.fixture(scope="session")
def cross_encoder_export(tmp_path_factory):
    """A random one-label cross-encoder (BERT body, 24 tokens per pair) written by
    sentence-transformers, read by from_hf and exported: (the ``CrossEncoder``, the reference;
    its ``OnnxModel``)."""
    from tests.core.embedding.checkpoints import write_cross_encoder

    folder = tmp_path_factory.mktemp("rerank")
    reference = write_cross_encoder(folder / "ce", max_length=24)
    return reference, _export(tk.from_hf(folder / "ce"), folder / "onnx")
