"""README's examples run as written."""

from __future__ import annotations

import re
import types
from pathlib import Path

import numpy as np
import pytest
import torch

import transformer_kit as tk

README = (Path(__file__).parent.parent / "README.md").read_text()


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README, flags=re.S)


def test_use_from_python_example(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    block = next(b for b in _python_blocks() if "model.save" in b)
    namespace: dict = {}
    exec(block, namespace)
    assert namespace["logits"].shape == (2, 4, 8000)
    assert namespace["new_tokens"].shape[0] == 2
    assert namespace["sampled"].shape[0] == 2
    assert namespace["beams"].shape[0] == 4  # 2 prompts x 2 returned sequences
    same = namespace["same"]
    assert torch.equal(same(namespace["prompts"]), namespace["model"](namespace["prompts"]))


def test_export_example_runs_after_the_python_example(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(next(b for b in _python_blocks() if "model.save" in b), namespace)
    exec(next(b for b in _python_blocks() if "export_onnx(model" in b), namespace)
    assert namespace["report"].max_error <= 1e-4
    assert namespace["logits"].shape == (2, 4, 8000)
    expected = namespace["model"].generate(namespace["prompts"], max_new_tokens=16).numpy()
    assert (namespace["tokens"] == expected).all()


def test_plugin_example_registers_and_builds(fresh_registry):
    block = next(b for b in _python_blocks() if b.startswith("# my_kernels.py"))
    module = types.ModuleType("my_kernels")
    exec(block, module.__dict__)
    tk.register_plugin(module)
    assert "cosine" in tk.get_registry().names("attention")
    torch.manual_seed(0)
    model = tk.build_model({"architecture": "decoder", "vocab_size": 20, "d_model": 16, "num_heads": 2,
                            "num_layers": 1, "d_ff": 32, "dropout": 0.0, "attention": "cosine",
                            "positional": "alibi"})
    kernel = model.decoder.layers[0].self_attention.kernel
    q, k, v = torch.randn(3, 1, 2, 4, 8).unbind(0)
    qn, kn = torch.nn.functional.normalize(q, dim=-1), torch.nn.functional.normalize(k, dim=-1)
    expected = torch.softmax(10.0 * qn @ kn.transpose(-2, -1), dim=-1) @ v
    torch.testing.assert_close(kernel(q, k, v), expected)
    ids = torch.tensor([[3, 4, 5, 6]])
    assert torch.equal(model.generate(ids, 5), model.generate(ids, 5, use_cache=False))


def test_chat_example_runs_and_agrees_with_the_model(tmp_path, monkeypatch):
    import json

    import jsonschema

    from tests.chat.checkpoint import write_chat_checkpoint

    monkeypatch.chdir(tmp_path)
    write_chat_checkpoint(tmp_path / "chat-checkpoint")
    namespace: dict = {}
    exec(next(b for b in _python_blocks() if "om.chat(" in b), namespace)
    model, messages = namespace["model"], namespace["messages"]
    assert namespace["reply"] == model.chat(messages, max_new_tokens=32)
    assert namespace["streamed"] == namespace["reply"]["content"]
    jsonschema.validate(namespace["answer"], namespace["colours"])
    call = namespace["call"]
    assert call["function"]["name"] == "get_weather"
    assert isinstance(json.loads(call["function"]["arguments"])["city"], str)


def test_embeddings_example(tmp_path, monkeypatch):
    """The embeddings example on folders made here under its names: a sentence-transformers
    model whose Dense layer gives 384 features, and a cross-encoder's export."""
    pytest.importorskip("sentence_transformers")
    from tests.embedding.checkpoints import write_cross_encoder, write_sentence_transformer
    from transformer_kit.export import export_onnx

    monkeypatch.chdir(tmp_path)
    reference = write_sentence_transformer(tmp_path / "all-MiniLM-L6-v2", dense=384, normalize=True)
    cross_encoder = write_cross_encoder(tmp_path / "ms-marco")
    export_onnx(tk.from_hf(tmp_path / "ms-marco"), tmp_path / "ms-marco-export")
    namespace: dict = {}
    exec(next(b for b in _python_blocks() if "om.embed(" in b), namespace)
    texts = ["A man is eating food.", "A man rides a horse."]
    np.testing.assert_allclose(namespace["vectors"], reference.encode(texts), atol=1e-5)
    query = reference.encode(["what do people eat?"], prompt_name="query")[:, :128]
    np.testing.assert_allclose(namespace["queries"], query / np.linalg.norm(query), atol=1e-5)
    expected = cross_encoder.predict([("what do people eat?", "A man is eating food.")])
    np.testing.assert_allclose(namespace["scores"], expected, atol=1e-5)
