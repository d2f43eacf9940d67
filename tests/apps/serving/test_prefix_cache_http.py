"""The prefix cache through the OpenAI-compatible server: ``usage.prompt_tokens_details.
cached_tokens`` as the official ``openai`` client reads it (completions, chat, a chat stream's
usage chunk), the cache's counters in ``/metrics``, and replies equal to those without it."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

import transformer_kit as tk
from tests.apps.serving.conftest import record_prompts
from tests.chat.checkpoint import write_chat_checkpoint
from transformer_kit.apps.serving.http import create_app
from transformer_kit.apps.serving.http import serve_in_thread as running
from transformer_kit.export import export_onnx
from transformer_kit.runtime import Engine, OnnxModel
from transformer_kit.runtime.left_padded import PREFILL_CHUNK


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)


def _metrics(url: str) -> dict[str, float]:
    """The prefix cache's lines of /metrics, by name."""
    text = httpx.get(f"{url}/metrics").text
    return {name: float(value) for name, value in
            re.findall(r"^(transformer_kit_prefix_cache_\w+) (\S+)$", text, re.M)}


def test_completions_report_cached_tokens_and_metrics_count_the_cache(padded_model):
    """Token-granular hits (the export without batch invariance; tests/apps/serving/
    test_prefix_cache.py says why)."""
    onnx_model = padded_model
    prefix = np.random.default_rng(0).integers(3, 37, 40).tolist()
    prompts = [[*prefix, 3, 9, 9], [*prefix, 4, 8]]
    engine = Engine(onnx_model, prefix_cache_bytes=10**7)
    with running(create_app(engine, "tiny")) as url:
        client = _client(url)
        assert _metrics(url)["transformer_kit_prefix_cache_hits_total"] == 0
        first, second = (client.completions.create(model="tiny", prompt=p, max_tokens=8, temperature=0)
                         for p in prompts)
        assert first.usage.prompt_tokens_details.cached_tokens == 0
        assert second.usage.prompt_tokens_details.cached_tokens == len(prefix)
        assert second.usage.prompt_tokens == len(prompts[1])
        metrics = _metrics(url)
    engine.close()
    with Engine(onnx_model) as plain:
        for prompt, completion in zip(prompts, (first, second), strict=True):
            tokens = plain.submit(np.array(prompt), max_new_tokens=8).result()
            assert completion.choices[0].model_extra["token_ids"] == tokens
    assert metrics["transformer_kit_prefix_cache_hits_total"] == 1
    assert metrics["transformer_kit_prefix_cache_misses_total"] == 1
    assert metrics["transformer_kit_prefix_cache_tokens_total"] == len(prefix)
    assert metrics["transformer_kit_prefix_cache_evictions_total"] == 0
    assert metrics["transformer_kit_prefix_cache_bytes"] == engine.prefix_cache.nbytes > 0
    assert metrics["transformer_kit_prefix_cache_max_bytes"] == 10**7


@pytest.fixture(scope="module")
def chat_export(tmp_path_factory) -> Path:
    folder = write_chat_checkpoint(tmp_path_factory.mktemp("prefix-chat") / "qwen2")
    export_onnx(tk.from_hf(folder), folder / "onnx")
    return folder / "onnx"


@pytest.mark.parametrize(("layout", "invariant"), [("left_padded", True), ("left_padded", False),
                                                   ("shared_buffer", True)],
                         ids=["batch-invariant", "token-granular", "shared-buffer"])
def test_chats_sharing_a_system_prompt_reuse_it_in_replies_and_streams(chat_export, layout, invariant):
    """A left-padded cache with batch invariance reuses whole chunks of 16 tokens
    (``left_padded.PREFILL_CHUNK``), without it every shared token; a shared buffer (the
    default) every shared token too, batch invariant."""
    chat_model = OnnxModel(chat_export, providers="cpu", batch_invariant=invariant, cache_layout=layout)
    system = {"role": "system", "content": "You answer questions about the weather in the cities "
              "of France, briefly and in plain words, without lists or tables. You give the "
              "temperature in degrees Celsius, the wind in kilometres an hour and the chance of "
              "rain as a percentage, and you say when the forecast is uncertain."}
    chats = [[system, {"role": "user", "content": question}]
             for question in ("Is it raining in Lyon?", "Why is Nice so warm?")]
    engine = Engine(chat_model, prefix_cache_bytes=10**7)
    prompts = record_prompts(engine)
    with running(create_app(engine, "chat")) as url:
        client = _client(url)
        first = client.chat.completions.create(model="chat", messages=chats[0], max_tokens=8,
                                               temperature=0)
        chunks = list(client.chat.completions.create(
            model="chat", messages=chats[1], max_tokens=8, temperature=0, stream=True,
            stream_options={"include_usage": True}))
        with_cache = _metrics(url)["transformer_kit_prefix_cache_tokens_total"]
    engine.close()
    shared = next(i for i, (a, b) in enumerate(zip(*prompts, strict=False)) if a != b)
    assert shared > 64  # the system prompt, rendered, is longer than a few chunks
    aligned = invariant and layout == "left_padded"
    reused = shared - shared % PREFILL_CHUNK if aligned else shared
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == reused == with_cache
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert first.choices[0].message.content == chat_model.chat(chats[0], max_new_tokens=8)["content"]
    assert text == chat_model.chat(chats[1], max_new_tokens=8)["content"]
