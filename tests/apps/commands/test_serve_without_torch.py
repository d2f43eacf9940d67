"""An install without torch serves exports: a virtual environment holding exactly the base
install's dependency closure (``transformer-kit[serve]``, taken from this environment:
``testbed.slim_env``), in which ``import torch`` fails, runs ``transformer-kit serve`` on a chat
model's export and on a sentence embedder's, and answers chats (greedy, streamed, held to a JSON
schema, sampled with a seed) and embeddings as the full install's runtime does; ``generate``
there takes the options that build logits processors (a repetition penalty, a minimum of new
tokens)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

import transformer_kit as tk
from testbed.slim_env import make_env
from tests.chat.checkpoint import write_chat_checkpoint
from transformer_kit.export import export_onnx
from transformer_kit.runtime import OnnxModel

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "sunny": {"type": "boolean"}},
          "required": ["city", "sunny"], "additionalProperties": False}


@pytest.fixture(scope="module")
def slim_python(tmp_path_factory) -> Path:
    python = make_env(tmp_path_factory.mktemp("slim") / "venv", ["transformer-kit[serve]"])
    found = subprocess.run([str(python), "-c", "import torch"], capture_output=True, text=True)
    assert found.returncode != 0 and "No module named 'torch'" in found.stderr
    return python


@pytest.fixture(scope="module")
def chat_export(tmp_path_factory) -> Path:
    folder = write_chat_checkpoint(tmp_path_factory.mktemp("slim-chat") / "qwen2")
    return export_onnx(tk.from_hf(folder), folder / "onnx").path


@contextlib.contextmanager
def serving(python: Path, folder: Path, name: str) -> Iterator[openai.OpenAI]:
    """``transformer-kit serve folder`` run by ``python``; an openai client of it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [str(python), "-m", "transformer_kit", "serve", str(folder), "--port", str(port),
               "--model-name", name]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.monotonic() + 120
        while True:
            assert process.poll() is None, process.stdout.read()
            assert time.monotonic() < deadline, "the server did not answer /health in 120 s"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        yield openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_an_install_without_torch_serves_chats_as_the_full_one_runs_them(slim_python, chat_export):
    om = OnnxModel(chat_export, providers="cpu")
    messages = [{"role": "user", "content": "What is the weather in Lyon?"}]
    with serving(slim_python, chat_export, "chat") as client:
        reply = client.chat.completions.create(model="chat", messages=messages, max_tokens=12, temperature=0)
        assert reply.choices[0].message.content == om.chat(messages, max_new_tokens=12)["content"]
        streamed = "".join(chunk.choices[0].delta.content or "" for chunk in client.chat.completions.create(
            model="chat", messages=messages, max_tokens=12, temperature=0, stream=True))
        assert streamed == reply.choices[0].message.content
        shaped = client.chat.completions.create(
            model="chat", messages=messages, max_tokens=48, temperature=0,
            response_format={"type": "json_schema", "json_schema": {"name": "weather", "schema": SCHEMA}})
        expected = om.chat(messages, max_new_tokens=48, response_format={
            "type": "json_schema", "json_schema": {"name": "weather", "schema": SCHEMA}})["content"]
        assert shaped.choices[0].message.content == expected
        if shaped.choices[0].finish_reason == "stop":
            assert set(json.loads(expected)) == {"city", "sunny"}
        sampled = client.chat.completions.create(model="chat", messages=messages, max_tokens=12,
                                                 temperature=0.8, top_p=0.9, seed=7)
        assert sampled.choices[0].message.content == om.chat(
            messages, max_new_tokens=12, do_sample=True, temperature=0.8, top_p=0.9, seed=7)["content"]


def test_generate_without_torch_takes_the_options_that_build_logits_processors(slim_python, chat_export):
    ids = [[5, 9, 11, 40, 41, 42]]
    options = {"max_new_tokens": 10, "repetition_penalty": 1.3, "min_new_tokens": 10, "do_sample": True,
               "top_k": 20, "seed": 3}
    code = ("import json, sys; from transformer_kit.runtime import OnnxModel; "
            "om = OnnxModel(sys.argv[1], providers='cpu'); "
            "print(json.dumps(om.generate(json.loads(sys.argv[2]), **json.loads(sys.argv[3])).tolist()))")
    arguments = [str(chat_export), json.dumps(ids), json.dumps(options)]
    run = subprocess.run([str(slim_python), "-c", code, *arguments], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    expected = OnnxModel(chat_export, providers="cpu").generate(np.array(ids), **options)
    assert json.loads(run.stdout) == expected.tolist()


def test_logits_processors_import_no_torch_where_it_is_installed(chat_export):
    """The full install loads the model components' plugin (and torch) only when they are asked
    for: decoding an export with processors and a JSON schema leaves torch unimported."""
    options = {"max_new_tokens": 10, "repetition_penalty": 1.3, "do_sample": True,
               "top_k": 20, "seed": 3,
               "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": SCHEMA}}}
    code = ("import json, sys; from transformer_kit.runtime import OnnxModel; "
            "om = OnnxModel(sys.argv[1], providers='cpu'); "
            "om.generate([[5, 9, 11, 40]], **json.loads(sys.argv[2])); print('torch' in sys.modules)")
    run = subprocess.run([sys.executable, "-c", code, str(chat_export), json.dumps(options)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["False"]


def test_an_install_without_torch_serves_embeddings(slim_python, embedding_export):
    st, om = embedding_export
    texts = ["the quick brown fox", "paris is the capital of france"]
    with serving(slim_python, om.path, "embed") as client:
        response = client.embeddings.create(model="embed", input=texts)
    np.testing.assert_allclose([d.embedding for d in response.data], st.encode(texts), atol=1e-5)
