"""transformer-kit serve: the server in a real process, text in and text out through the
official openai client, as onnxruntime's generate gives it; an embedding model's export on
/v1/embeddings; the bounds on prompts and on a request's time reach the app; a folder that is
no export, an encoder with neither pooling nor a classifier, and bounds that cannot work are
refused with a sentence."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import httpx
import numpy as np
import openai

from tests.apps.conftest import invoke
from tests.checkpoints.test_lora import two_adapters  # noqa: F401 (a fixture)
from transformer_kit.apps.commands.serve import DrainingServer
from transformer_kit.runtime import OnnxModel


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def served_apps(monkeypatch) -> list:
    """The apps ``serve`` hands its server from now on (the server not started)."""
    apps = []
    monkeypatch.setattr(DrainingServer, "run", lambda self: apps.append(self.server.config.app))
    return apps


def test_serve_answers_text_completions_in_a_real_process(text_export, tmp_path):
    port = _free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen([sys.executable, "-m", "transformer_kit", "serve", str(text_export),
                                "--port", str(port), "--model-name", "tiny-gpt2"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
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
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        om = OnnxModel(text_export, providers="cpu")
        completion = client.completions.create(model="tiny-gpt2", prompt="the quick", max_tokens=12,
                                               temperature=0)
        assert completion.choices[0].text == om.generate("the quick", 12)
        streamed = "".join(chunk.choices[0].text for chunk in client.completions.create(
            model="tiny-gpt2", prompt="the quick", max_tokens=12, temperature=0, stream=True))
        assert streamed == completion.choices[0].text
        stop = completion.choices[0].text[3:5]  # a stop string the greedy text holds
        stopped = client.completions.create(model="tiny-gpt2", prompt="the quick", max_tokens=12,
                                            temperature=0, stop=[stop])
        assert stopped.choices[0].text == om.generate("the quick", 12, stop=[stop])
        assert stopped.choices[0].finish_reason == "stop"
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    assert process.returncode is not None


def test_serve_refuses_a_folder_that_is_neither_an_export_nor_a_checkpoint(exported):
    _, folder = exported
    result = invoke("serve", str(folder), "--port", "1")
    assert result.exit_code == 1, result.output
    assert "is neither an export nor a checkpoint; give an export folder" in result.output
    assert "Traceback" not in result.output


def test_serve_on_ray_refuses_a_folder_that_is_not_an_export_before_ray_starts(exported):
    _, folder = exported
    result = invoke("serve", str(folder), "--ray", "--replicas", "2")
    assert result.exit_code == 1, result.output
    assert "export" in result.output and "Traceback" not in result.output
    bad = invoke("serve", str(folder / "onnx"), "--ray", "--replicas", "0")
    assert bad.exit_code == 2 and "--replicas" in bad.output


def test_serve_refuses_bad_guard_settings_and_warns_when_open_beyond_this_machine(exported):
    _, folder = exported
    empty = invoke("serve", str(folder / "onnx"), "--api-key", " ")
    assert empty.exit_code == 2 and "--api-key" in empty.output, empty.output
    body = invoke("serve", str(folder / "onnx"), "--max-body-mb", "0")
    assert body.exit_code == 2 and "--max-body-mb" in body.output, body.output
    for flag in ("--max-prompt-tokens", "--max-request-seconds"):
        zero = invoke("serve", str(folder / "onnx"), flag, "0")
        assert zero.exit_code == 2 and flag in zero.output and "got 0" in zero.output, zero.output
    open_ = invoke("serve", str(folder), "--host", "0.0.0.0")  # no model: stops after
    assert "without an API key" in open_.output and open_.exit_code == 1, open_.output
    local = invoke("serve", str(folder), "--host", "127.0.0.1")
    assert "without an API key" not in local.output


def test_the_prompt_and_time_bounds_reach_the_app(exported, monkeypatch):
    from transformer_kit.runtime import Limits

    _, folder = exported
    apps = served_apps(monkeypatch)
    given = invoke("serve", str(folder / "onnx"), "--max-prompt-tokens", "8",
                   "--max-request-seconds", "2.5")
    assert given.exit_code == 0, given.output
    assert "prompts <= 8 tokens, requests <= 2.5 s" in given.output
    assert apps[-1].state.server.service.limits == Limits(8, 2.5, 64)
    default = invoke("serve", str(folder / "onnx"))  # the model's context length; 600 s
    assert default.exit_code == 0, default.output
    assert "prompts <= 64 tokens, requests <= 600 s" in default.output
    assert apps[-1].state.server.service.limits == Limits(64, 600.0, 64)


def test_the_stored_responses_bound_reaches_the_app(exported, monkeypatch):
    _, folder = exported
    apps = served_apps(monkeypatch)
    given = invoke("serve", str(folder / "onnx"), "--stored-responses", "3")
    assert given.exit_code == 0, given.output
    assert apps[-1].state.responses.capacity == 3
    assert invoke("serve", str(folder / "onnx")).exit_code == 0
    assert apps[-1].state.responses.capacity == 256
    refused = invoke("serve", str(folder / "onnx"), "--stored-responses", "-1")
    assert refused.exit_code != 0 and "--stored-responses" in refused.output


def test_the_prefix_cache_bound_reaches_the_engine(exported, monkeypatch):
    _, folder = exported
    apps = served_apps(monkeypatch)
    given = invoke("serve", str(folder / "onnx"), "--prefix-cache-bytes", "1048576")
    assert given.exit_code == 0, given.output
    assert "prefix cache 1 MiB" in given.output
    assert apps[-1].state.server.engine.prefix_cache.max_bytes == 2**20
    off = invoke("serve", str(folder / "onnx"), "--prefix-cache-bytes", "0")
    assert "prefix cache off" in off.output and apps[-1].state.server.engine.prefix_cache is None
    default = invoke("serve", str(folder / "onnx"))
    assert apps[-1].state.server.engine.prefix_cache.max_bytes == 256 * 2**20, default.output
    bad = invoke("serve", str(folder / "onnx"), "--prefix-cache-bytes", "-1")
    assert bad.exit_code != 0 and "must be at least 0" in bad.output


def test_the_prompt_lookup_default_reaches_the_engine(exported, monkeypatch):
    _, folder = exported
    apps = served_apps(monkeypatch)
    given = invoke("serve", str(folder / "onnx"), "--prompt-lookup-num-tokens", "6")
    assert given.exit_code == 0, given.output
    assert "prompt lookup <= 6 tokens" in given.output
    assert apps[-1].state.server.engine.generation.prompt_lookup_num_tokens == 6
    default = invoke("serve", str(folder / "onnx"))
    assert "prompt lookup" not in default.output
    assert apps[-1].state.server.engine.generation.prompt_lookup_num_tokens is None
    bad = invoke("serve", str(folder / "onnx"), "--prompt-lookup-num-tokens", "0")
    assert bad.exit_code != 0 and "--prompt-lookup-num-tokens" in bad.output


def test_serve_on_ray_takes_the_key_and_the_body_limit(exported, monkeypatch):
    """--ray passes --api-key (or its environment variable), --max-body-mb and the prompt and
    time bounds on to the deployment (tests/apps/serving/test_ray.py checks they apply there)."""
    from transformer_kit.apps.commands import serve as command

    _, folder = exported
    given = []
    monkeypatch.setattr(command, "_serve_on_ray", lambda *args, **kwargs: given.append(kwargs))
    monkeypatch.setenv("TRANSFORMER_KIT_API_KEY", "from-env")
    result = invoke("serve", str(folder / "onnx"), "--ray", "--api-key", "k", "--max-body-mb", "2",
                    "--max-prompt-tokens", "8", "--max-request-seconds", "2.5")
    assert result.exit_code == 0, result.output
    assert invoke("serve", str(folder / "onnx"), "--ray").exit_code == 0
    names = ("api_key", "max_body_bytes", "max_prompt_tokens", "max_request_seconds",
             "prefix_cache_bytes")
    # without --max-body-mb: None, the app's bound by model kind (4 MiB, a speech model's 25 MiB)
    assert [[kwargs[n] for n in names] for kwargs in given] == [
        ["k", 2 * 2**20, 8, 2.5, 256 * 2**20], ["from-env", None, None, 600.0, 256 * 2**20]]


def test_serve_answers_embeddings_in_a_real_process(embedding_export):
    st, om = embedding_export
    port = _free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TRANSFORMER_KIT_API_KEY": "sk-embed"}
    process = subprocess.Popen([sys.executable, "-m", "transformer_kit", "serve", str(om.path),
                                "--port", str(port), "--model-name", "tiny-embed"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
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
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-embed", max_retries=0)
        texts = ["the quick brown fox", "paris is the capital of france"]
        keyless = httpx.post(f"http://127.0.0.1:{port}/v1/embeddings", json={"model": "tiny-embed",
                                                                           "input": texts})
        assert keyless.status_code == 401, keyless.text  # the key came from the environment
        response = client.embeddings.create(model="tiny-embed", input=texts)
        np.testing.assert_allclose([d.embedding for d in response.data], st.encode(texts), atol=1e-5)
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_serve_refuses_an_encoder_with_neither_pooling_nor_a_classifier(tmp_path, embedding_export):
    _, om = embedding_export
    plain = shutil.copytree(om.path, tmp_path / "plain")  # the export, its head left out of the manifest
    manifest = json.loads((plain / "manifest.json").read_text())
    manifest["config"].pop("pooling")
    manifest["config"].pop("sentence_embedding")
    (plain / "manifest.json").write_text(json.dumps(manifest))
    result = invoke("serve", str(plain), "--port", "1")
    assert result.exit_code == 1, result.output
    assert "neither pooling" in result.output and "Traceback" not in result.output
    ray = invoke("serve", str(plain), "--ray")  # refused before Ray starts, with the same sentence
    assert ray.exit_code == 1 and "neither pooling" in ray.output, ray.output


def test_serve_exports_a_checkpoint_or_its_hub_name_once_and_names_the_model_so(tmp_path, monkeypatch):
    """A checkpoint given by its Hub name is exported into the kit's cache (once) and served as
    that export, under the name as given (as vLLM names it)."""
    from tests.chat.checkpoint import write_chat_checkpoint
    from tests.checkpoints.hub_cache import place_snapshot
    from transformer_kit.runtime import OnnxModel

    checkpoint = write_chat_checkpoint(tmp_path / "chat", layers=1)
    place_snapshot(tmp_path / "hub", "org/chat", checkpoint, "c" * 40)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMER_KIT_CACHE", str(tmp_path / "kit"))
    monkeypatch.chdir(tmp_path / "hub")
    apps = served_apps(monkeypatch)
    first = invoke("serve", "org/chat")
    assert first.exit_code == 0, first.output
    assert "exporting org/chat into" in first.output and "serving 'org/chat' from" in first.output
    assert "chat page: http://127.0.0.1:8000/" in first.output
    served = apps[-1].state.server.service.model
    messages = [{"role": "user", "content": "hello"}]
    (export,) = (tmp_path / "kit" / "exports").iterdir()
    assert served.chat(messages, max_new_tokens=8) == OnnxModel(export).chat(messages, max_new_tokens=8)
    again = invoke("serve", "org/chat", "--model-name", "mine")
    assert again.exit_code == 0 and "exporting" not in again.output and "serving 'mine'" in again.output


def test_the_generation_config_mode_reaches_the_service_and_is_printed(exported, monkeypatch):
    _, folder = exported
    apps = served_apps(monkeypatch)
    auto = invoke("serve", str(folder / "onnx"))
    assert "sampling: OpenAI's defaults (the checkpoint sets none)" in auto.output
    ignored = invoke("serve", str(folder / "onnx"), "--generation-config", "ignore")
    assert ignored.exit_code == 0, ignored.output
    assert "sampling: OpenAI's defaults (--generation-config ignore)" in ignored.output
    assert apps[-1].state.server.service.generation_defaults == {}
    bad = invoke("serve", str(folder / "onnx"), "--generation-config", "vllm")
    assert bad.exit_code != 0 and "--generation-config" in bad.output


def test_serve_exports_a_checkpoint_with_named_adapters_and_serves_each(two_adapters, tmp_path,  # noqa: F811
                                                                        monkeypatch):
    from tests.checkpoints.test_lora import _ids
    _, folder, expected = two_adapters
    monkeypatch.setenv("TRANSFORMER_KIT_CACHE", str(tmp_path / "kit"))
    apps = served_apps(monkeypatch)
    given = invoke("serve", str(folder.parent / "base"), "--model-name", "llama", "--adapter",
                   f"first={folder.parent / 'first'}", "--adapter", f"second={folder.parent / 'second'}")
    assert given.exit_code == 0, given.output
    assert "adapters: llama:first, llama:second" in given.output
    assert list(apps[-1].state.server.served) == ["llama", "llama:first", "llama:second"]
    (export,) = (tmp_path / "kit" / "exports").iterdir()
    om = OnnxModel(export)
    for name in ("first", "second"):
        tokens = om.generate(_ids().numpy(), 8, adapter=name)
        np.testing.assert_array_equal(tokens, expected[name][1].numpy())
    merged = invoke("serve", str(folder.parent / "base"), "--adapter", str(folder.parent / "first"))
    assert merged.exit_code == 2 and "serve adapters as NAME=DIR" in merged.output, merged.output
    again = invoke("serve", str(export), "--adapter", f"first={folder.parent / 'first'}")
    assert again.exit_code == 1 and "is an export folder, already made; --adapter" in again.output
    ray = invoke("serve", str(export), "--ray")  # refused before Ray starts
    assert ray.exit_code == 2 and "--ray serves the base model only" in ray.output, ray.output
    own = invoke("serve", str(export), "--model-name", "llama")  # the export's adapters, no flag
    assert own.exit_code == 0
    assert list(apps[-1].state.server.served) == ["llama", "llama:first", "llama:second"]
