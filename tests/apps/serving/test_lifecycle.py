"""A request's life beyond its endpoint: a slow chat template renders off the event loop (a
request sent while it renders is answered first), a client that leaves a non-streaming request
stops its decoding (the engine's stats), and ``transformer-kit serve`` drains on SIGTERM (new
requests 503 with a sentence, the one in flight answered, exit status 0)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

import transformer_kit as tk
from tests.apps.serving.test_http import _slowed
from tests.chat.checkpoint import write_chat_checkpoint
from transformer_kit.apps.serving.http import create_app
from transformer_kit.apps.serving.http import serve_in_thread as running
from transformer_kit.export import export_onnx
from transformer_kit.runtime import Engine, OnnxModel

#: A ChatML template that, asked to (``chat_template_kwargs={"loops": n}``), first loops n x
#: 1,000 times: a template as slow as the test needs.
SLOW_TEMPLATE = (
    "{%- for i in range(loops | default(0)) %}{%- for j in range(1000) %}{%- endfor %}{%- endfor %}"
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}")
HELLO = [{"role": "user", "content": "Hello there"}]


@pytest.fixture(scope="module")
def slow_chat(tmp_path_factory):
    """(the export's folder, its OnnxModel, loops that make the template render ~``seconds``)."""
    folder = write_chat_checkpoint(tmp_path_factory.mktemp("slow") / "qwen2", SLOW_TEMPLATE)
    export_onnx(tk.from_hf(folder), folder / "onnx")
    om = OnnxModel(folder / "onnx", providers="cpu")
    return folder / "onnx", om


def _loops_for(om: OnnxModel, seconds: float) -> int:
    """The loops that make the template take about ``seconds`` here (measured: the machine's
    speed varies; the sandbox stops a render at 5 s)."""
    start = time.perf_counter()
    om.tokenizer.apply_chat_template(HELLO, loops=100)
    return max(1, int(100 * seconds / (time.perf_counter() - start)))


def _wait(condition, what: str, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_a_slow_template_does_not_hold_other_requests(slow_chat):
    _, om = slow_chat
    engine = Engine(om, max_batch=4)
    events: list[str] = []
    submit = engine.submit

    def recording(ids, **options):
        events.append(f"submitted {len(ids)}")
        return submit(ids, **options)

    engine.submit = recording
    app = create_app(engine, "chat")
    loops = _loops_for(om, 2.0)
    with running(app) as url:
        def slow() -> None:
            body = {"model": "chat", "messages": HELLO, "max_tokens": 2, "temperature": 0,
                    "chat_template_kwargs": {"loops": loops}}
            response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
            events.append(f"slow answered {response.status_code}")

        thread = threading.Thread(target=slow)
        thread.start()
        _wait(lambda: app.state.admission.in_flight == 1, "the slow request did not arrive")
        fast = httpx.post(f"{url}/v1/completions", json={"model": "chat", "prompt": [5, 6, 7],
                                                          "max_tokens": 2, "temperature": 0}, timeout=60)
        events.append(f"fast answered {fast.status_code}")
        thread.join(60)
    engine.close()
    prompt_tokens = len(om.tokenizer.encode([om.tokenizer.apply_chat_template(HELLO)],
                                            add_special_tokens=False)[0][0])
    # the fast request was submitted and answered while the slow template still rendered
    assert events == ["submitted 3", "fast answered 200", f"submitted {prompt_tokens}",
                      "slow answered 200"]


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_a_client_that_leaves_a_non_streaming_request_stops_its_decoding(slow_chat, endpoint):
    _, om = slow_chat
    engine = _slowed(Engine(om, max_batch=4), 0.02)  # 400 tokens: 8 s
    body = ({"model": "chat", "prompt": [5, 6, 7]} if endpoint == "completions"
            else {"model": "chat", "messages": HELLO})
    with running(create_app(engine, "chat")) as url:
        with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes its connection
            httpx.post(f"{url}/v1/{'chat/' if endpoint == 'chat' else ''}completions",
                       json={**body, "max_tokens": 400, "temperature": 0}, timeout=0.5)
        _wait(lambda: engine.stats.finished.get("cancelled", 0) == 1, f"not cancelled: {engine.stats}")
        assert engine.stats.batch_size == 0
        assert engine.stats.generated_tokens < 400  # decoding stopped when the client left
        metrics = httpx.get(f"{url}/metrics").text
        assert re.search(r'transformer_kit_requests_total\{outcome="cancelled"\} 1\.0', metrics)
    engine.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _in_flight(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return float(re.search(r"^transformer_kit_http_requests_in_flight (\S+)$", text, re.M).group(1))


def test_sigterm_stops_admitting_finishes_what_it_holds_and_exits_0(slow_chat, tmp_path: Path):
    folder, om = slow_chat
    port, loops = _free_port(), _loops_for(om, 2.0)
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200"}
    server = subprocess.Popen([sys.executable, "-m", "transformer_kit", "serve", str(folder), "--port",
                               str(port), "--model-name", "chat", "--provider", "cpu",
                               "--drain-seconds", "30"], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env=env)
    try:
        _wait(lambda: server.poll() is None and _up(url), "the server did not start", 120)
        answers: list[httpx.Response] = []
        body = {"model": "chat", "messages": HELLO, "max_tokens": 3, "temperature": 0,
                "chat_template_kwargs": {"loops": loops}}
        held = threading.Thread(target=lambda: answers.append(
            httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)))
        held.start()
        _wait(lambda: _in_flight(url) == 2, "the held request did not arrive")  # it and /metrics
        server.send_signal(signal.SIGTERM)
        refused = _refused_after_sigterm(url)
        assert refused.status_code == 503
        assert "shutting down" in refused.json()["error"]["message"]
        held.join(120)
        assert answers[0].status_code == 200, answers[0].text
        expected = om.chat(HELLO, max_new_tokens=3, temperature=0)["content"]
        assert answers[0].json()["choices"][0]["message"]["content"] == expected
        assert server.wait(60) == 0, server.stdout.read()
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def _up(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def _refused_after_sigterm(url: str) -> httpx.Response:
    """The answer to a request sent once the server took the signal (the signal arrives
    asynchronously: until then a request is still admitted, and answered)."""
    deadline = time.monotonic() + 30
    while True:
        response = httpx.get(f"{url}/v1/models", timeout=10)
        if response.status_code != 200 or time.monotonic() > deadline:
            return response
        time.sleep(0.01)
