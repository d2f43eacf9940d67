"""The OpenAI-compatible server on 127.0.0.1: the official ``openai`` client gets completions
and streams whose greedy tokens equal ``OnnxModel.generate``; concurrent streams are batched;
a client that leaves mid-stream frees its row; bad requests get a status and a sentence and the
server keeps serving."""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import openai
import pytest

from transformer_kit.apps.serving import Engine
from transformer_kit.apps.serving.http import create_app
from transformer_kit.apps.serving.http import serve_in_thread as running


@pytest.fixture(scope="module")
def server(onnx_model):
    engine = Engine(onnx_model, max_batch=8, max_queue=64)
    with running(create_app(engine, "tiny")) as url:
        yield url, engine
    engine.close()


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)


def _alone(model, prompt: list[int], new: int) -> list[int]:
    """generate's greedy tokens for ``prompt`` alone, up to and including an eos id."""
    row = model.generate(np.array([prompt]), attention_mask=np.ones((1, len(prompt))),
                         max_new_tokens=new)[0].tolist()
    eos = model.manifest.eos_id
    return row[:row.index(eos) + 1] if eos in row else row


def _ids(choice) -> list[int]:
    return choice.model_extra["token_ids"]


def test_the_openai_client_gets_generates_greedy_tokens(server, onnx_model):
    url, _ = server
    client = _client(url)
    assert [m.id for m in client.models.list().data] == ["tiny"]
    prompt = [5, 6, 7, 8]
    completion = client.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0)
    choice = completion.choices[0]
    assert _ids(choice) == _alone(onnx_model, prompt, 12)
    assert choice.finish_reason == ("length" if len(_ids(choice)) == 12 else "stop")
    assert completion.usage.prompt_tokens == 4 and completion.usage.completion_tokens == len(_ids(choice))
    streamed, reasons = [], []
    for chunk in client.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0,
                                           stream=True):
        streamed += _ids(chunk.choices[0])
        reasons.append(chunk.choices[0].finish_reason)
    assert streamed == _ids(choice) and reasons[-1] == choice.finish_reason and not any(reasons[:-1])


def _metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    return float(re.search(rf"^{name} (\S+)$", text, re.M).group(1))


def test_concurrent_streaming_clients_each_get_their_sequential_tokens(server, onnx_model):
    url, _ = server
    rng = np.random.default_rng(0)
    cases = [(rng.integers(0, 37, int(n)).tolist(), int(m))
             for n, m in zip(rng.integers(1, 20, 32), rng.integers(1, 40, 32), strict=True)]

    def stream(case: tuple[list[int], int]) -> list[int]:
        prompt, new = case
        chunks = _client(url).completions.create(model="tiny", prompt=prompt, max_tokens=new,
                                                 temperature=0, stream=True)
        return [t for chunk in chunks for t in _ids(chunk.choices[0])]

    with ThreadPoolExecutor(len(cases)) as clients:  # all at once; a client's error is raised here
        results = list(clients.map(stream, cases, timeout=120))
    for (prompt, new), tokens in zip(cases, results, strict=True):
        assert tokens == _alone(onnx_model, prompt, new)
    assert _metric(url, "transformer_kit_max_batch_size") > 1


@pytest.mark.parametrize(("body", "status", "message"), [
    (b'{"model": "tiny", "prompt": [1, 2', 400, "not valid JSON"),
    (b'{"model": "tiny", "prompt": [1, 2], "best_of": 3}', 400, "Unknown field 'best_of'"),
    (b'{"model": "tiny", "prompt": [1, 2], "max_tokens": -1}', 400, "max_tokens"),
    (b'{"model": "tiny", "prompt": [1, 2], "max_tokens": 63}', 400, "context length is 64"),
    (b'{"model": "tiny", "prompt": [1, 99], "max_tokens": 2}', 400, "99"),
    (b'{"model": "tiny", "prompt": "some text", "max_tokens": 2}', 400, "no tokenizer"),
    (b'{"model": "tiny", "prompt": [[1], [2]], "max_tokens": 2}', 400, "one prompt per request"),
    (b'{"model": "other", "prompt": [1, 2]}', 404, "'other' does not exist"),
])
def test_bad_requests_get_a_status_and_a_sentence_and_the_server_keeps_serving(server, body, status,
                                                                              message):
    url, _ = server
    response = httpx.post(f"{url}/v1/completions", content=body,
                          headers={"content-type": "application/json"})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert message in error["message"] and error["type"]
    good = httpx.post(f"{url}/v1/completions", json={"model": "tiny", "prompt": [1, 2], "max_tokens": 2,
                                                     "temperature": 0})
    assert good.status_code == 200 and len(good.json()["choices"][0]["token_ids"]) >= 1
    assert httpx.get(f"{url}/health").json() == {"status": "ok"}


def _slowed(engine: Engine, seconds: float) -> Engine:
    """Each decoding step of ``engine`` takes ``seconds`` more (a slow model, for timing)."""
    step = engine.batch.step

    def slow(tokens):
        time.sleep(seconds)
        return step(tokens)

    engine.batch.step = slow
    return engine


def test_a_client_that_leaves_mid_stream_frees_its_row(onnx_model):
    engine = _slowed(Engine(onnx_model, max_batch=4), 0.02)  # 60 tokens: 1.2 s
    with running(create_app(engine, "tiny")) as url:
        body = {"model": "tiny", "prompt": [3, 4], "max_tokens": 60, "temperature": 0, "stream": True}
        with httpx.stream("POST", f"{url}/v1/completions", json=body) as response:
            lines = response.iter_lines()
            assert next(lines).startswith("data: ")  # the first token came; then the client leaves
        deadline = time.monotonic() + 10
        while engine.stats["finished"].get("cancelled", 0) == 0:
            assert time.monotonic() < deadline, engine.stats
            time.sleep(0.02)
        assert engine.stats["batch_size"] == 0 and _metric(url, "transformer_kit_batch_size") == 0
        assert _metric(url, re.escape('transformer_kit_requests_total{outcome="cancelled"}')) == 1
        again = httpx.post(f"{url}/v1/completions", json={**body, "stream": False, "max_tokens": 3})
        assert again.status_code == 200
    engine.close()


def test_a_full_queue_answers_503(onnx_model):
    engine = Engine(onnx_model, max_batch=1, max_queue=1, start=False)
    with running(create_app(engine, "tiny")) as url:
        waiting = engine.submit([1, 2], max_new_tokens=2)  # fills the queue: the loop is not started
        response = httpx.post(f"{url}/v1/completions", json={"model": "tiny", "prompt": [1], "max_tokens": 2})
        assert response.status_code == 503 and "max_queue" in response.json()["error"]["message"]
        engine.start()
        assert waiting.result()
        assert httpx.post(f"{url}/v1/completions",
                          json={"model": "tiny", "prompt": [1], "max_tokens": 2}).status_code == 200
        assert 'transformer_kit_requests_total{outcome="queue_full"} 1.0' in httpx.get(f"{url}/metrics").text
    engine.close()
