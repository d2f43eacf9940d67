"""The OpenAI-compatible server on 127.0.0.1: the official ``openai`` client gets completions
and streams whose greedy tokens equal ``OnnxModel.generate``; concurrent streams are batched;
a client that leaves mid-stream frees its row; bad requests get a status and a sentence and the
server keeps serving; a prompt over the server's bound gets 400 (``context_length_exceeded``) and
a request past its time 504 (a stream: an error event the client raises on), its row freed,
while the other clients keep getting exact tokens."""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import openai
import pytest

from transformer_kit.apps.serving.http import create_app
from transformer_kit.apps.serving.http import serve_in_thread as running
from transformer_kit.core.errors import InputError
from transformer_kit.runtime import Engine


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
    (b'{"model": "tiny", "prompt": [1, 2], "best_of": 3, "n": 4}', 400, "best_of (3) is less than n (4)"),
    (b'{"model": "tiny", "prompt": [1, 2], "max_tokens": -1}', 400, "max_tokens"),
    (b'{"model": "tiny", "prompt": [1, 2], "max_tokens": 63}', 400, "context length is 64"),
    (b'{"model": "tiny", "prompt": [1, 99], "max_tokens": 2}', 400, "99"),
    (b'{"model": "tiny", "prompt": "some text", "max_tokens": 2}', 400, "no tokenizer"),
    (b'{"model": "tiny", "prompt": [], "max_tokens": 2}', 400, "empty list"),
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


def test_a_prompt_over_the_bound_gets_400_with_the_numbers_while_others_get_exact_tokens(onnx_model):
    engine = Engine(onnx_model, max_batch=8)
    with running(create_app(engine, "tiny", max_prompt_tokens=16)) as url:
        long = {"model": "tiny", "prompt": list(range(3, 23)), "max_tokens": 2}  # 20 tokens
        prompts = [[5 + i, 9, 11 + i] for i in range(4)]

        def complete(prompt: list[int]) -> list[int]:
            choice = _client(url).completions.create(model="tiny", prompt=prompt, max_tokens=8,
                                                     temperature=0).choices[0]
            return _ids(choice)

        with ThreadPoolExecutor(8) as pool:
            refused = [pool.submit(httpx.post, f"{url}/v1/completions", json=long) for _ in range(4)]
            good = [pool.submit(complete, p) for p in prompts]
            assert [g.result() for g in good] == [_alone(onnx_model, p, 8) for p in prompts]
            for answer in (r.result() for r in refused):
                assert answer.status_code == 400, answer.text
                error = answer.json()["error"]
                assert error["code"] == "context_length_exceeded"
                assert "has 20 tokens" in error["message"] and "16 tokens" in error["message"]
                assert "--max-prompt-tokens" in error["message"]
        at_the_bound = complete(list(range(3, 19)))  # 16 tokens: taken
        assert at_the_bound == _alone(onnx_model, list(range(3, 19)), 8)
    engine.close()


def test_the_prompt_bound_defaults_to_the_context_length_and_no_room_for_max_tokens_is_refused_alike(
        server):
    url, _ = server
    client = _client(url)
    with pytest.raises(openai.BadRequestError) as over:
        client.completions.create(model="tiny", prompt=[5] * 70, max_tokens=2)
    assert over.value.code == "context_length_exceeded"
    assert "has 70 tokens" in str(over.value) and "context length, 64 tokens" in str(over.value)
    with pytest.raises(openai.BadRequestError) as no_room:
        client.completions.create(model="tiny", prompt=[5] * 40, max_tokens=30)
    assert no_room.value.code == "context_length_exceeded" and "70 in all" in str(no_room.value)


def _slowed(engine: Engine, seconds: float) -> Engine:
    """Each decoding step of ``engine`` takes ``seconds`` more (a slow model, for timing)."""
    step = engine.generation.decoder.step

    def slow(tokens):
        time.sleep(seconds)
        return step(tokens)

    engine.generation.decoder.step = slow
    return engine


def test_a_client_that_leaves_mid_stream_frees_its_row(onnx_model):
    engine = _slowed(Engine(onnx_model, max_batch=4), 0.02)  # 60 tokens: 1.2 s
    with running(create_app(engine, "tiny")) as url:
        body = {"model": "tiny", "prompt": [3, 4], "max_tokens": 60, "temperature": 0, "stream": True}
        with httpx.stream("POST", f"{url}/v1/completions", json=body) as response:
            lines = response.iter_lines()
            assert next(lines).startswith("data: ")  # the first token came; then the client leaves
        deadline = time.monotonic() + 10
        while engine.stats.finished.get("cancelled", 0) == 0:
            assert time.monotonic() < deadline, engine.stats
            time.sleep(0.02)
        assert engine.stats.batch_size == 0 and _metric(url, "transformer_kit_batch_size") == 0
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


def test_a_request_past_its_time_gets_an_error_its_row_is_freed_and_the_server_goes_on(onnx_model):
    engine = _slowed(Engine(onnx_model, max_batch=4), 0.05)  # 60 tokens: 3 s
    with running(create_app(engine, "tiny", max_request_seconds=1.0)) as url:
        client, prompt = _client(url), [3, 4]
        slow = {"model": "tiny", "prompt": prompt, "max_tokens": 60, "temperature": 0}
        with ThreadPoolExecutor(2) as pool:  # a normal client at the same time
            normal = pool.submit(lambda: _ids(client.completions.create(
                model="tiny", prompt=[5, 6, 7], max_tokens=4, temperature=0).choices[0]))
            with pytest.raises(openai.InternalServerError) as late:
                client.completions.create(**slow)
            assert normal.result() == _alone(onnx_model, [5, 6, 7], 4)
        assert late.value.status_code == 504 and late.value.code == "request_timeout"
        assert "limit of 1 s" in str(late.value) and "max_tokens" in str(late.value)
        streamed = []
        with pytest.raises(openai.APIError, match="limit of 1 s") as cut:
            for chunk in client.completions.create(**slow, stream=True):
                streamed += _ids(chunk.choices[0])
        assert cut.value.code == "request_timeout"
        assert 1 <= len(streamed) < 60 and streamed == _alone(onnx_model, prompt, 60)[:len(streamed)]
        assert engine.stats.finished["timeout"] == 2
        assert engine.stats.batch_size == 0 and _metric(url, "transformer_kit_batch_size") == 0
        assert _metric(url, re.escape('transformer_kit_requests_total{outcome="timeout"}')) == 2
        after = client.completions.create(model="tiny", prompt=prompt, max_tokens=4, temperature=0)
        assert _ids(after.choices[0]) == _alone(onnx_model, prompt, 4)
    engine.close()


def test_the_bounds_must_be_positive(onnx_model):
    engine = Engine(onnx_model, start=False)
    with pytest.raises(InputError, match="max_prompt_tokens must be at least 1"):
        create_app(engine, "tiny", max_prompt_tokens=0)
    with pytest.raises(InputError, match="max_request_seconds must be more than 0"):
        create_app(engine, "tiny", max_request_seconds=0)
    engine.close()
