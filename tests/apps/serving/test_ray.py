"""Ray Serve on a local Ray instance bound to 127.0.0.1, shared by this module's tests: two
replicas, each with its own engine, behind an API key, serve the tokens ``OnnxModel.generate``
gives and the replies ``OnnxModel.chat`` gives (a chat export: tests/chat/checkpoint.py); a
wrong key gets 401 and /health is open; a replica killed (SIGKILL) mid-stream ends that stream
with an error the client sees, the other replica keeps serving exactly, and Ray Serve brings a
new replica up that serves exactly too; two replicas of a sentence-embedding model and two of a
cross-encoder on the same instance give sentence-transformers' vectors and scores behind the same
key and limits, and a replica of a speech model OnnxModel.transcribe's subtitles; after shutdown
no Ray process is left."""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from itertools import count
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest

import transformer_kit as tk
from tests.apps.serving.test_http import _alone, _ids
from tests.chat.checkpoint import write_chat_checkpoint
from transformer_kit.core.speech.formats import render
from transformer_kit.export import export_onnx
from transformer_kit.runtime import OnnxModel

RAY_PROGRAMS = ("raylet", "gcs_server", "ray::", "default_worker.py", "log_monitor.py",
                "dashboard", "runtime_env_agent", "monitor.py")
APP, DEPLOYMENT, KEY = "transformer-kit", "CompletionDeployment", "the-key"
MAX_BODY_BYTES = 64 * 1024
#: The longest any wait of this module lasts (a request, a stream's end, a replica's return).
WAIT_S = 120


def _ray_processes() -> set[int]:
    """Processes of this machine whose command line is one of Ray's programs (zombies excluded)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = next(line for line in (entry / "status").read_text().splitlines()
                         if line.startswith("State:"))
        except (OSError, StopIteration):
            continue
        if "Z" not in state.split()[1] and any(program in command for program in RAY_PROGRAMS):
            found.add(int(entry.name))
    return found


def _descendants(root: int) -> set[int]:
    """The processes that ``root`` started, and those they started, and so on."""
    children: dict[int, set[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:  # stat: "PID (COMMAND) STATE PPID ...", COMMAND possibly with spaces and parentheses
            parent = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(parent, set()).add(int(entry.name))
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _until(condition: Callable[[], Any], what: str, seconds: float = WAIT_S) -> Any:
    """``condition()`` once it is true, polled every half second; fails after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not (value := condition()):
        assert time.monotonic() < deadline, f"not within {seconds} s: {what}"
        time.sleep(0.5)
    return value


@pytest.fixture(scope="module")
def chat_export(tmp_path_factory):
    """(checkpoint folder, its export in onnxruntime): a chat model also serves completions."""
    folder = write_chat_checkpoint(tmp_path_factory.mktemp("ray-chat") / "qwen2")
    export_onnx(tk.from_hf(folder), folder / "onnx")
    return folder, OnnxModel(folder / "onnx", providers="cpu")


@pytest.fixture(scope="module")
def ray_app(chat_export) -> Iterator[str]:
    """The base URL of two replicas of the export's deployment, behind ``KEY`` and bodies of at
    most ``MAX_BODY_BYTES``, on a local Ray instance; afterwards no Ray process may be left."""
    import ray
    from ray import serve

    from transformer_kit.apps.serving.ray_serve import application

    folder, _ = chat_export
    port = _free_port()
    with pytest.MonkeyPatch.context() as env:
        env.setenv("RAY_AUTH_MODE", "disabled")  # a local test instance: no token needed
        # Ray Serve gives its HTTP proxy 5 s to get ready and 10 s per health check; beside the other
        # tests on 2 cores it can take longer (measured: marked unhealthy, and serve.start failed)
        for name in ("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S"):
            env.setenv(name, "120")
        # "local": a new instance of the test's own, even where a Ray cluster runs on this machine
        # (its address in /tmp/ray/ray_current_cluster) or RAY_ADDRESS names one
        # CPUs as Ray counts them (the replicas share the machine's cores whatever it counts):
        # enough for every deployment this module keeps up at once, 2 x 0.5 + 4 x 0.25 + 0.25,
        # since a replica Ray cannot place keeps serve.run waiting for ever
        ray.init(address="local", num_cpus=3, include_dashboard=False, log_to_driver=False,
                 _node_ip_address="127.0.0.1")
        try:
            serve.start(http_options={"host": "127.0.0.1", "port": port})
            serve.run(application(folder / "onnx", "tiny", replicas=2, num_cpus=0.5, providers="cpu",
                                  api_key=KEY, max_body_bytes=MAX_BODY_BYTES),
                      name=APP, route_prefix="/")
            assert _running() == 2
            yield f"http://127.0.0.1:{port}"
        finally:
            # this instance's processes (the test's descendants): never another Ray's on the machine
            ours = _ray_processes() & _descendants(os.getpid())
            serve.shutdown()
            ray.shutdown()
    _until(lambda: not ours & _ray_processes(), "every Ray process this test started ends", 60)


def _deploy(app: Any, name: str, route_prefix: str, cpus: float) -> None:
    """``serve.run(app)`` once Ray has the ``cpus`` its replicas ask for: an unplaceable replica
    would keep ``serve.run`` waiting without end, so too few fails here with a sentence."""
    import ray
    from ray import serve

    free = ray.available_resources().get("CPU", 0.0)
    assert free >= cpus, f"{name}: its replicas ask for {cpus} CPUs and Ray has {free} free"
    serve.run(app, name=name, route_prefix=route_prefix)


def _running() -> int:
    """How many replicas of the deployment Ray Serve reports RUNNING."""
    from ray import serve

    return serve.status().applications[APP].deployments[DEPLOYMENT].replica_states.get("RUNNING", 0)


def _replica_pids() -> dict[str, int]:
    """The deployment's live replicas, as Ray knows them: replica id -> process id."""
    import ray
    from ray._private.state import actors

    prefix = f"SERVE_REPLICA::{APP}#{DEPLOYMENT}#"
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
             if a["name"].startswith(prefix)]
    pids = {}
    for name in names:
        try:
            info = actors(actor_id=ray.get_actor(name, namespace="serve")._actor_id.hex())
        except ValueError:  # the actor ended between the listing and the look-up
            continue
        if info["State"] == "ALIVE" and info["Pid"]:
            pids[name.removeprefix(prefix)] = info["Pid"]
    return pids


def _two_replicas(gone: str | None = None) -> dict[str, int] | None:
    """The two live replicas (id -> process id) once Ray has two, ``gone`` not among them."""
    pids = _replica_pids()
    return pids if len(pids) == 2 and gone not in pids else None


def _client(url: str, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=60)


def _cases(seed: int, count: int) -> list[tuple[list[int], int]]:
    """``count`` (prompt ids, max_tokens) pairs."""
    rng = np.random.default_rng(seed)
    return [(rng.integers(0, 37, int(n)).tolist(), int(m))
            for n, m in zip(rng.integers(1, 12, count), rng.integers(1, 20, count), strict=True)]


def _ask(client: openai.OpenAI, prompt: list[int], new: int, stream: bool) -> tuple[list[int], str]:
    """(greedy tokens, the replica that answered) for one completion, streamed or not."""
    raw = client.completions.with_raw_response.create(model="tiny", prompt=prompt, max_tokens=new,
                                                      temperature=0, stream=stream)
    reply = raw.parse()
    tokens = ([t for chunk in reply for t in _ids(chunk.choices[0])] if stream
              else _ids(reply.choices[0]))
    return tokens, raw.headers["x-replica"]


def _exact_concurrently(client: openai.OpenAI, model: OnnxModel, seed: int,
                        count: int = 8) -> set[str]:
    """``count`` concurrent completions (every other one streamed) get ``generate``'s tokens;
    the replicas that answered."""
    cases = _cases(seed, count)
    with ThreadPoolExecutor(count) as clients:  # a client's error is raised here
        results = list(clients.map(lambda i: _ask(client, *cases[i], stream=i % 2 == 1),
                                   range(count), timeout=WAIT_S))
    for (prompt, new), (tokens, _) in zip(cases, results, strict=True):
        assert tokens == _alone(model, prompt, new)
    return {replica for _, replica in results}


def test_two_replicas_behind_the_key_serve_generate_s_tokens_and_chat(ray_app, chat_export):
    _, onnx_model = chat_export
    client = _client(ray_app)
    _exact_concurrently(client, onnx_model, seed=3)
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    for stream in (False, True):
        reply = client.chat.completions.create(model="tiny", messages=messages, max_tokens=16,
                                               temperature=0, stream=stream)
        text = ("".join(c.choices[0].delta.content or "" for c in reply if c.choices) if stream
                else reply.choices[0].message.content)
        assert text == onnx_model.chat(messages, max_new_tokens=16)["content"]


def test_a_wrong_key_gets_401_health_is_open_and_a_large_body_413(ray_app):
    for key in ("wrong", KEY + "x"):
        with pytest.raises(openai.AuthenticationError) as refused:
            _client(ray_app, key).completions.create(model="tiny", prompt=[1], max_tokens=1)
        assert refused.value.code == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        _client(ray_app, "wrong").models.list()
    assert httpx.post(f"{ray_app}/v1/completions", json={"model": "tiny", "prompt": [1]},
                      timeout=60).status_code == 401  # no Authorization header at all
    health = httpx.get(f"{ray_app}/health", timeout=60)
    assert health.status_code == 200 and health.json() == {"status": "ok"}
    assert health.headers["x-replica"]
    with pytest.raises(openai.APIStatusError) as large:
        _client(ray_app).completions.create(model="tiny", prompt=[1] * MAX_BODY_BYTES, max_tokens=1)
    assert large.value.status_code == 413


def _long_prompt(model: OnnxModel, new: int) -> list[int]:
    """A one-token prompt whose greedy continuation has ``new`` tokens and no eos."""
    return next([p] for p in range(37) if len(_alone(model, [p], new)) == new)


def _kill_mid_stream(url: str, prompt: list[int], new: int, pids: dict[str, int],
                     ) -> tuple[str, list[int], openai.APIConnectionError | None, float]:
    """Streams ``new`` tokens of ``prompt`` and kills (SIGKILL) the replica sending them after its
    first tokens: (that replica, the tokens the stream gave, the error that ended it (None: it
    ended as a finished answer), the seconds from the kill to the stream's end)."""
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=30)
    raw = client.completions.with_raw_response.create(model="tiny", prompt=prompt, max_tokens=new,
                                                      temperature=0, stream=True)
    victim, stream, tokens = raw.headers["x-replica"], raw.parse(), []
    for chunk in stream:
        tokens.extend(_ids(chunk.choices[0]))
        if len(tokens) >= 5:
            break
    os.kill(pids[victim], signal.SIGKILL)
    killed = time.monotonic()
    try:
        for chunk in stream:  # bounded: the client gives up after 30 s without a byte
            tokens.extend(_ids(chunk.choices[0]))
    except openai.APIConnectionError as error:
        return victim, tokens, error, time.monotonic() - killed
    return victim, tokens, None, time.monotonic() - killed


def test_a_replica_killed_mid_stream_fails_that_stream_and_a_new_one_serves(ray_app, chat_export):
    _, onnx_model = chat_export
    client, new = _client(ray_app), 1000
    prompt = _long_prompt(onnx_model, new)  # about 1 s of streaming: the kill lands in it
    expected = _alone(onnx_model, prompt, new)
    deadline, victim = time.monotonic() + WAIT_S, None
    while True:  # the kill may come after the stream's end on a starved machine: again
        before = _until(partial(_two_replicas, gone=victim), "two live replicas")
        victim, tokens, error, seconds = _kill_mid_stream(ray_app, prompt, new, before)
        if error is not None:
            break
        assert tokens == expected  # finished before the kill: whole and exact
        assert time.monotonic() < deadline, (f"not within {WAIT_S} s: a kill while the stream was "
                                             "sending (every stream finished before its kill)")
    # the stream raised: not a hang (a timeout), not a finished-looking truncated answer
    assert not isinstance(error, openai.APITimeoutError) and seconds < 20, (error, seconds)
    assert tokens == expected[:len(tokens)] and len(tokens) < new

    survivor = next(r for r in before if r != victim)
    assert _exact_concurrently(client, onnx_model, seed=5) == {survivor}  # meanwhile
    after = _until(partial(_two_replicas, gone=victim), "Ray Serve replaces the killed replica")
    _until(lambda: _running() == 2, "two replicas RUNNING again")
    (newcomer,) = set(after) - {survivor}
    assert after[survivor] == before[survivor] and after[newcomer] not in before.values()
    served, seeds = set(), count(6)

    def the_newcomer_answers() -> bool:  # Ray's proxy may learn of the new replica late
        served.update(_exact_concurrently(client, onnx_model, seed=next(seeds)))
        return newcomer in served

    _until(the_newcomer_answers, f"the new replica {newcomer} answers one of 8 concurrent requests")
    assert served <= {survivor, newcomer}


@pytest.fixture(scope="module")
def pooling_apps(ray_app, embedding_export, cross_encoder_export) -> dict[str, str]:
    """The base URLs of two replicas each of the embedding model's and the cross-encoder's
    deployments, on the same Ray instance behind the same key and body bound."""

    from transformer_kit.apps.serving.ray_serve import application

    urls = {}
    for name, (_, exported) in {"embed": embedding_export, "rerank": cross_encoder_export}.items():
        _deploy(application(exported.path, f"tiny-{name}", replicas=2, num_cpus=0.25,
                            providers="cpu", api_key=KEY, max_body_bytes=MAX_BODY_BYTES),
                name, f"/{name}", cpus=0.5)
        urls[name] = f"{ray_app}/{name}"
    return urls


def test_two_replicas_serve_embeddings_and_rerank_exactly_behind_the_same_key(pooling_apps,
                                                                             embedding_export,
                                                                             cross_encoder_export):
    st, _ = embedding_export
    ce, _ = cross_encoder_export
    texts = [f"text number {i} about {'cats' if i % 2 else 'the weather'}" for i in range(16)]
    client = _client(pooling_apps["embed"])

    def embed(i: int) -> tuple[list[list[float]], str]:
        raw = client.embeddings.with_raw_response.create(model="tiny-embed", input=texts[i:i + 2],
                                                         encoding_format="float")
        return [d.embedding for d in raw.parse().data], raw.headers["x-replica"]

    replicas: set[str] = set()
    vectors: list[list[float]] = []

    def both_answer() -> bool:  # requests until both replicas have answered, each exactly
        with ThreadPoolExecutor(8) as clients:
            results = list(clients.map(embed, range(0, 16, 2), timeout=WAIT_S))
        vectors[:] = [v for rows, _ in results for v in rows]
        np.testing.assert_allclose(vectors, st.encode(texts), atol=1e-5)
        replicas.update(replica for _, replica in results)
        return len(replicas) == 2

    _until(both_answer, "both embedding replicas answer")
    with pytest.raises(openai.AuthenticationError):
        _client(pooling_apps["embed"], "wrong").embeddings.create(model="tiny-embed", input="cats")
    with pytest.raises(openai.BadRequestError) as empty:  # the same sentence as the one-process server
        client.embeddings.create(model="tiny-embed", input="")
    assert "input[0] is an empty string" in empty.value.message
    query, documents = "Which text is about cats?", texts[:5]
    answer = httpx.post(f"{pooling_apps['rerank']}/v1/rerank", headers={"Authorization": f"Bearer {KEY}"},
                        json={"model": "tiny-rerank", "query": query, "documents": documents},
                        timeout=WAIT_S).json()
    scores = {r["index"]: r["relevance_score"] for r in answer["results"]}
    np.testing.assert_allclose([scores[i] for i in range(5)], ce.predict([(query, d) for d in documents]),
                               atol=1e-5)


def test_a_replica_serves_transcriptions_behind_the_same_key(ray_app, whisper_tiny_en):
    from ray import serve

    from tests.conftest import SPEECH_CLIPS
    from transformer_kit.apps.serving.ray_serve import application

    _, export = whisper_tiny_en
    _deploy(application(export, "tiny-en", replicas=1, num_cpus=0.25, providers="cpu", api_key=KEY),
            "speech", "/speech", cpus=0.25)
    clip = sorted(Path(SPEECH_CLIPS).glob("*.wav"))[0]
    expected = OnnxModel(export, providers="cpu").transcribe(clip)
    client = _client(f"{ray_app}/speech")
    with open(clip, "rb") as audio:  # a body past the text servers' bound: a speech model's is 25 MiB
        answer = client.audio.transcriptions.create(model="tiny-en", file=audio, response_format="srt")
    assert clip.stat().st_size > MAX_BODY_BYTES
    assert answer == render(expected, "srt")
    with pytest.raises(openai.BadRequestError, match="could not be read as audio"):
        client.audio.transcriptions.create(model="tiny-en", file=("notes.wav", b"not a sound"))
    serve.delete("speech")
