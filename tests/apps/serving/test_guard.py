"""The server's door on 127.0.0.1: with an API key, the openai client gets exact tokens with the
key and a 401 without it, /health stays open; oversized, chunked-oversized, slow and malformed
bodies get 413, 408 and 400 with a sentence, an over-long prompt 400 and a request past its time
504, while normal clients, at the same time, keep getting ``OnnxModel.generate``'s exact tokens."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import openai
import pytest

from transformer_kit.apps.serving.guard import Guard
from transformer_kit.apps.serving.http import create_app
from transformer_kit.apps.serving.http import serve_in_thread as running
from transformer_kit.runtime import Engine

KEY = "sk-test-0123456789"
LIMIT = 64 * 1024
PROMPT_LIMIT, SECONDS = 16, 2.0


@pytest.fixture(scope="module")
def engine(onnx_model):
    engine = Engine(onnx_model, max_batch=8, max_queue=64)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def server(engine):
    app = create_app(engine, "tiny", api_key=KEY, max_body_bytes=LIMIT, body_seconds=1.0,
                     max_prompt_tokens=PROMPT_LIMIT, max_request_seconds=SECONDS)
    with running(app) as url:
        yield url


def _expected(model, prompt: list[int], new: int) -> list[int]:
    row = model.generate(np.array([prompt]), attention_mask=np.ones((1, len(prompt))),
                         max_new_tokens=new)[0].tolist()
    eos = model.manifest.eos_id
    return row[:row.index(eos) + 1] if eos in row else row


def _complete(url: str, prompt: list[int], key: str = KEY) -> list[int]:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=60)
    choice = client.completions.create(model="tiny", prompt=prompt, max_tokens=8, temperature=0).choices[0]
    return choice.model_extra["token_ids"]


def test_the_key_lets_the_openai_client_in_and_keeps_others_out(server, onnx_model):
    assert _complete(server, [5, 6, 7]) == _expected(onnx_model, [5, 6, 7], 8)
    with pytest.raises(openai.AuthenticationError) as wrong:
        _complete(server, [5, 6, 7], key="sk-not-the-key")
    assert wrong.value.status_code == 401 and "wrong key" in str(wrong.value)
    bare = httpx.post(f"{server}/v1/completions", json={"model": "tiny", "prompt": [5], "max_tokens": 1})
    assert bare.status_code == 401 and bare.headers["www-authenticate"] == "Bearer"
    error = bare.json()["error"]
    assert error["code"] == "invalid_api_key" and "no Authorization header" in error["message"]
    assert httpx.get(f"{server}/v1/models").status_code == 401
    assert httpx.get(f"{server}/metrics", headers={"Authorization": f"Basic {KEY}"}).status_code == 401
    assert httpx.get(f"{server}/health").json() == {"status": "ok"}  # probes need no key
    models = httpx.get(f"{server}/v1/models", headers={"Authorization": f"bearer {KEY}"})
    assert models.status_code == 200 and models.json()["data"][0]["id"] == "tiny"


def test_oversized_bodies_get_413_without_being_read(server):
    auth = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    body = json.dumps({"model": "tiny", "prompt": list(range(5, 5 + 20_000)), "max_tokens": 1}).encode()
    assert len(body) > LIMIT
    declared = httpx.post(f"{server}/v1/completions", content=body, headers=auth)
    assert declared.status_code == 413
    assert f"at most {LIMIT:,} bytes" in declared.json()["error"]["message"]

    def chunks():  # no Content-Length: counted as it arrives
        for start in range(0, len(body), 8192):
            yield body[start:start + 8192]

    chunked = httpx.post(f"{server}/v1/completions", content=chunks(), headers=auth)
    assert chunked.status_code == 413 and "over 65,536 bytes" in chunked.json()["error"]["message"]


def test_a_slow_body_gets_408(server):
    def trickle():
        yield b'{"model": "tiny", '
        time.sleep(2.5)  # the server waits body_seconds=1
        yield b'"prompt": [5], "max_tokens": 1}'

    answer = httpx.post(f"{server}/v1/completions", content=trickle(), timeout=10,
                        headers={"Authorization": f"Bearer {KEY}"})
    assert answer.status_code == 408 and "within 1 s" in answer.json()["error"]["message"]
    _assert_serving(server)


def _assert_serving(url: str) -> None:
    assert httpx.get(f"{url}/health").status_code == 200


def test_bad_requests_alongside_normal_clients(server, engine, onnx_model, monkeypatch):
    """Oversized, slow, malformed and keyless requests, an over-long prompt and one that runs
    past its time, at the same time as 6 normal clients: every normal client gets its exact
    tokens, every bad one its status, and the late one's row is freed."""
    step = engine.generation.decoder.step

    def slow(tokens):  # 0.05 s a step: 8 tokens take 0.4 s, 60 take 3 s (past SECONDS)
        time.sleep(0.05)
        return step(tokens)

    monkeypatch.setattr(engine.generation.decoder, "step", slow)
    auth = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    prompts = [[5 + i, 9, 11 + i] for i in range(6)]
    big = json.dumps({"model": "tiny", "prompt": list(range(5, 30_005))}).encode()

    def slow():
        yield b'{"model": "tiny",'
        time.sleep(2.0)
        yield b'"prompt": [5]}'

    bad = {
        "oversized": lambda: httpx.post(f"{server}/v1/completions", content=big, headers=auth),
        "malformed": lambda: httpx.post(f"{server}/v1/completions", content=b'{"model": "ti', headers=auth),
        "keyless": lambda: httpx.post(f"{server}/v1/completions", json={"model": "tiny", "prompt": [5]}),
        "slow": lambda: httpx.post(f"{server}/v1/completions", content=slow(), headers=auth, timeout=10),
        "long prompt": lambda: httpx.post(f"{server}/v1/completions", headers=auth, json={
            "model": "tiny", "prompt": [5] * (PROMPT_LIMIT + 1), "max_tokens": 1}),
        "late": lambda: httpx.post(f"{server}/v1/completions", headers=auth, timeout=30, json={
            "model": "tiny", "prompt": [3, 4], "max_tokens": 60, "temperature": 0}),
    }
    expected = {"oversized": 413, "malformed": 400, "keyless": 401, "slow": 408, "long prompt": 400,
                "late": 504}
    with ThreadPoolExecutor(len(prompts) + len(bad)) as pool:
        bad_answers = {name: pool.submit(call) for name, call in bad.items()}
        good = [pool.submit(_complete, server, p) for p in prompts]
        assert [g.result() for g in good] == [_expected(onnx_model, p, 8) for p in prompts]
        for name, future in bad_answers.items():
            try:
                status = future.result().status_code
            except httpx.HTTPError:  # a slow body's connection may be closed under it
                assert name == "slow"
                continue
            assert status == expected[name], name
    assert bad_answers["long prompt"].result().json()["error"]["code"] == "context_length_exceeded"
    assert bad_answers["late"].result().json()["error"]["code"] == "request_timeout"
    assert engine.stats.finished["timeout"] == 1 and engine.stats.batch_size == 0
    assert _complete(server, prompts[0]) == _expected(onnx_model, prompts[0], 8)


def test_the_guard_refuses_settings_that_cannot_work():
    with pytest.raises(ValueError, match="empty"):
        Guard(lambda *a: None, api_key="  ")
    with pytest.raises(ValueError, match="positive"):
        Guard(lambda *a: None, max_body_bytes=0)
