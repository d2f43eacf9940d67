"""The repository ``transformer-kit triton`` writes, served by a real Triton Inference Server (the
``tritonserver`` of the nvidia-pytriton wheel, on 127.0.0.1) and driven with tritonclient: gRPC
streaming and HTTP ``generate_stream`` give ``OnnxModel.generate``'s tokens, its texts and
``OnnxModel.chat``'s replies; 8 concurrent streams are each exact; bad requests get errors and the
server keeps serving; the prompt bound is answered as the HTTP server answers it, and a request
over the body bound (``--max-body-mb``) is refused on HTTP and gRPC by the model itself (this
wheel's Triton 24.10 has no ``--http-max-input-size``, Triton has no gRPC bound). The generate
model's export is a chat model (tests/chat/checkpoint.py): ids, text and messages in. A
sentence-embedding model and a cross-encoder are served beside it: their vectors and scores
match sentence-transformers', batched across concurrent clients."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

import transformer_kit as tk
from testbed import triton_local as tritonserver
from tests.apps.conftest import invoke
from tests.apps.serving.test_http import _alone
from tests.chat.checkpoint import write_chat_checkpoint
from transformer_kit.apps.serving.triton import body_flags, key_flags
from transformer_kit.export import export_onnx
from transformer_kit.runtime import OnnxModel

grpcclient = pytest.importorskip("tritonclient.grpc")
InferenceServerException = pytest.importorskip("tritonclient.utils").InferenceServerException

MODEL = "tiny_generate"
#: The server needs it on inference, as transformer-kit serve --api-key (transformer-kit triton's flags).
KEY = "the-key"
HEADERS = {"authorization": f"Bearer {KEY}"}
#: gRPC carries the header under Triton's prefix for restricted protocols.
GRPC_HEADERS = {"triton-grpc-protocol-authorization": f"Bearer {KEY}"}
#: The generate model's prompt bound (its config's max_prompt_tokens).
MAX_PROMPT_TOKENS = 100
#: The generate model's body bound (transformer-kit triton --max-body-mb 0.0625: 64 KiB).
MAX_BODY_BYTES = 64 * 1024
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def triton(tmp_path_factory, embedding_export, cross_encoder_export):
    """(server, the export in onnxruntime): the server up with the generate model loaded."""
    root = tritonserver.wheel_root()
    if root is None:
        pytest.skip("nvidia-pytriton (the wheel with tritonserver) is not installed: pip install "
                    "--no-deps nvidia-pytriton==0.7.0, as .ci/run does.")
    work = tmp_path_factory.mktemp("triton-server")
    folder = write_chat_checkpoint(work / "qwen2")
    export_onnx(tk.from_hf(folder), folder / "onnx")
    try:
        env = tritonserver.model_environment(work / "model-env")
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"numpy<2 for the model's environment cannot be installed here: {exc}")
    written = invoke("triton", str(folder / "onnx"), "-o", str(work / "repo"), "--name", "tiny",
                     "--env", str(env), "--max-prompt-tokens", str(MAX_PROMPT_TOKENS),
                     "--max-body-mb", str(MAX_BODY_BYTES / 2**20))
    assert written.exit_code == 0, written.output
    for name, (_, exported) in {"st": embedding_export, "ce": cross_encoder_export}.items():
        written = invoke("triton", str(exported.path), "-o", str(work / "repo"), "--name", name,
                         "--env", str(env))
        assert written.exit_code == 0, written.output
    models = [MODEL, "st_embed", "ce_rerank"]
    with tritonserver.local_server(work / "repo", models, work / "server", flags=key_flags(KEY)) as server:
        yield server, OnnxModel(folder / "onnx", providers="cpu")


def _grpc_stream(server, inputs: dict[str, np.ndarray], timeout: float = 60, model: str = MODEL,
                 headers: dict[str, str] | None = GRPC_HEADERS) -> list:
    """The responses of one gRPC streaming request: each a numpy array of its output, or the
    error's text; ends at the final flag."""
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)), headers=headers)
    tensors = []
    for name, value in inputs.items():
        kind = "BYTES" if value.dtype == object else {np.int64: "INT64", np.float32: "FP32"}[value.dtype.type]
        tensor = grpcclient.InferInput(name, list(value.shape), kind)
        tensor.set_data_from_numpy(value)
        tensors.append(tensor)
    outputs = []
    try:
        client.async_stream_infer(model, tensors, enable_empty_final_response=True)
        while True:
            result, error = answers.get(timeout=timeout)
            if error is not None:
                outputs.append(str(error))
                break
            response = result.get_response()
            if response.outputs:
                name = response.outputs[0].name
                outputs.append(result.as_numpy(name))
            if response.parameters["triton_final_response"].bool_param:
                break
    finally:
        client.stop_stream()
        client.close()
    return outputs


def _ids(prompt: list[int], **options) -> dict[str, np.ndarray]:
    types = {"max_new_tokens": np.int64, "seed": np.int64, "temperature": np.float32, "top_p": np.float32}
    return {"input_ids": np.array(prompt, np.int64),
            **{k: np.array([v], types[k]) for k, v in options.items()}}


def _http_stream(server, body: dict) -> list[dict]:
    """The events of HTTP ``generate_stream`` (Triton's generate extension), as JSON."""
    url = f"http://127.0.0.1:{server.http_port}/v2/models/{MODEL}/generate_stream"
    with httpx.stream("POST", url, json=body, timeout=60, headers=HEADERS) as answer:
        return [json.loads(line[len("data: "):]) for line in answer.iter_lines()
                if line.startswith("data: ")]


def test_grpc_streams_generate_s_greedy_and_sampled_tokens(triton):
    server, onnx_model = triton
    prompt = [5, 6, 7, 8]
    greedy = [int(a[0]) for a in _grpc_stream(server, _ids(prompt, max_new_tokens=12))]
    assert greedy == _alone(onnx_model, prompt, 12) and len(greedy) >= 1
    sampled = [int(a[0]) for a in _grpc_stream(server, _ids(prompt, max_new_tokens=12, temperature=0.8,
                                                            top_p=0.9, seed=3))]
    expected = onnx_model.generate(np.array([prompt]), max_new_tokens=12, do_sample=True,
                                   temperature=0.8, top_p=0.9, seed=3)[0].tolist()
    assert sampled == expected[:len(sampled)] and len(sampled) >= 1
    assert sampled != greedy  # the options reach the model


def test_http_generate_stream_gives_tokens_text_and_chat_replies(triton):
    server, onnx_model = triton
    events = _http_stream(server, {"input_ids": [9, 10, 11], "max_new_tokens": 10})
    assert [e["token_ids"] for e in events] == _alone(onnx_model, [9, 10, 11], 10)
    events = _http_stream(server, {"text_input": "The weather in Paris", "max_new_tokens": 10})
    assert "".join(e["text_output"] for e in events) == onnx_model.generate("The weather in Paris",
                                                                           max_new_tokens=10)
    events = _http_stream(server, {"messages": json.dumps(MESSAGES), "max_new_tokens": 16})
    assert all("text_output" in e for e in events), events
    reply = onnx_model.chat(MESSAGES, max_new_tokens=16)["content"]
    assert "".join(e["text_output"] for e in events) == reply
    text = _grpc_stream(server, {"text_input": np.array([b"The weather"], dtype=object),
                                 "max_new_tokens": np.array([8], np.int64)})
    assert b"".join(a[0] for a in text).decode() == onnx_model.generate("The weather", max_new_tokens=8)


def test_eight_concurrent_streams_are_each_exact(triton):
    server, onnx_model = triton
    rng = np.random.default_rng(5)
    cases = [(rng.integers(0, 400, int(n)).tolist(), int(m))
             for n, m in zip(rng.integers(1, 12, 8), rng.integers(4, 20, 8), strict=True)]

    def ask(case: tuple[list[int], int]) -> list[int]:
        prompt, new = case
        return [int(a[0]) for a in _grpc_stream(server, _ids(prompt, max_new_tokens=new), timeout=120)]

    with ThreadPoolExecutor(len(cases)) as clients:
        results = list(clients.map(ask, cases, timeout=300))
    for (prompt, new), tokens in zip(cases, results, strict=True):
        assert tokens == _alone(onnx_model, prompt, new)


def test_bad_requests_get_errors_and_the_server_keeps_serving(triton):
    server, onnx_model = triton
    vocab = onnx_model.manifest.src_vocab
    outside, = _grpc_stream(server, _ids([5, vocab + 3], max_new_tokens=4))
    assert str(vocab + 3) in outside and "vocabulary" in outside
    both = _http_stream(server, {"input_ids": [5, 6], "text_input": "x"})
    assert len(both) == 1 and "exactly one of input_ids, text_input, messages" in both[0]["error"]
    broken = _http_stream(server, {"messages": "not json", "max_new_tokens": 4})
    assert len(broken) == 1 and "JSON list of chat messages" in broken[0]["error"]
    unknown = httpx.post(f"http://127.0.0.1:{server.http_port}/v2/models/{MODEL}/generate_stream",
                         json={"prompt_ids": [5]}, timeout=30, headers=HEADERS)
    assert unknown.status_code == 400 and "prompt_ids" in unknown.text
    after = [int(a[0]) for a in _grpc_stream(server, _ids([5, 6, 7], max_new_tokens=8))]
    assert after == _alone(onnx_model, [5, 6, 7], 8)


def test_a_prompt_over_the_bound_is_refused_as_the_http_server_refuses_it(triton):
    from transformer_kit.runtime import Limits

    server, onnx_model = triton
    long = list(range(5, 5 + MAX_PROMPT_TOKENS + 1))
    refused, = _grpc_stream(server, _ids(long, max_new_tokens=4))
    with pytest.raises(tk.InputError) as expected:  # the same sentence the HTTP server answers
        Limits.of(onnx_model.context_length, MAX_PROMPT_TOKENS).check_prompt(len(long))
    assert str(expected.value) in refused
    assert [int(a[0]) for a in _grpc_stream(server, _ids(long[:MAX_PROMPT_TOKENS], max_new_tokens=4))] == \
        _alone(onnx_model, long[:MAX_PROMPT_TOKENS], 4)


def test_embeddings_and_rerank_are_exact_and_batched_across_clients(triton, embedding_export,
                                                                      cross_encoder_export):
    server, _ = triton
    st, embedder = embedding_export
    ce, _ = cross_encoder_export
    texts = [f"text number {i} about {'cats' if i % 2 else 'the weather'}" for i in range(12)]

    def embed(i: int) -> np.ndarray:
        batch = np.array([t.encode() for t in texts[i:i + 3]], dtype=object)
        out, = _grpc_stream(server, {"text_input": batch}, model="st_embed")
        return out

    with ThreadPoolExecutor(4) as clients:
        vectors = list(clients.map(embed, range(0, 12, 3), timeout=120))
    np.testing.assert_allclose(np.concatenate(vectors), st.encode(texts), atol=1e-5)
    cut, = _grpc_stream(server, {"text_input": np.array([b"cats"], dtype=object),
                                 "dimensions": np.array([8], np.int64)}, model="st_embed")
    np.testing.assert_allclose(cut, embedder.embed(["cats"], dimensions=8), atol=1e-5)
    documents = texts[:5]
    scores, = _grpc_stream(server, {"query": np.array([b"Which text is about cats?"], dtype=object),
                                    "documents": np.array([d.encode() for d in documents], dtype=object)},
                           model="ce_rerank")
    np.testing.assert_allclose(scores, ce.predict([("Which text is about cats?", d) for d in documents]),
                               atol=1e-5)
    empty, = _grpc_stream(server, {"query": np.array([b" "], dtype=object),
                                   "documents": np.array([b"x"], dtype=object)}, model="ce_rerank")
    assert "query is empty" in empty


def _grpc_refused(server, headers: dict[str, str] | None) -> bool:
    """Whether a gRPC stream sent with ``headers`` is refused: its first answer an error, no
    token (the refusal may also be raised at once, the stream then already closed)."""
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)), headers=headers)
    ids = grpcclient.InferInput("input_ids", [2], "INT64")
    ids.set_data_from_numpy(np.array([5, 6], np.int64))
    try:
        with contextlib.suppress(InferenceServerException):
            client.async_stream_infer(MODEL, [ids], enable_empty_final_response=True)
        result, error = answers.get(timeout=60)
        return result is None and error is not None
    finally:
        client.stop_stream()
        client.close()


def test_inference_needs_the_key_and_health_is_open(triton):
    server, onnx_model = triton
    url = f"http://127.0.0.1:{server.http_port}/v2/models/{MODEL}/generate_stream"
    for headers in ({}, {"authorization": "Bearer wrong"}):
        refused = httpx.post(url, json={"input_ids": [5, 6], "max_new_tokens": 2}, timeout=30,
                             headers=headers)
        assert refused.status_code == 403 and "restricted" in refused.text, refused.text
        grpc_headers = {f"triton-grpc-protocol-{k}": v for k, v in headers.items()} or None
        assert _grpc_refused(server, grpc_headers)
    assert not _grpc_refused(server, GRPC_HEADERS)  # the check is real: the key passes
    health = httpx.get(f"http://127.0.0.1:{server.http_port}/v2/health/ready", timeout=30)
    assert health.status_code == 200
    assert [int(a[0]) for a in _grpc_stream(server, _ids([5, 6], max_new_tokens=2))] == \
        _alone(onnx_model, [5, 6], 2)


def test_a_request_over_the_body_bound_is_refused_and_the_server_keeps_serving(triton):
    server, onnx_model = triton
    sentence = f"this server takes at most {MAX_BODY_BYTES:,} bytes (--max-body-mb)"
    url = f"http://127.0.0.1:{server.http_port}/v2/models/{MODEL}/generate_stream"
    body = json.dumps({"text_input": "a " * 2**19, "max_new_tokens": 2})  # 1 MiB, 512K tokens
    refused = httpx.post(url, content=body, timeout=60, headers=HEADERS)  # refused before tokenizing
    size = 4 + 2**20 + 8  # the text with its length, and max_new_tokens
    assert refused.status_code == 400 and f"The request's inputs are {size:,} bytes" in refused.text
    assert sentence in refused.text
    over = MAX_BODY_BYTES // 8 + 1  # ids of 8 bytes: one byte over the bound
    refused, = _grpc_stream(server, _ids(list(range(5, 5 + over))))
    assert f"{over * 8:,} bytes" in refused and sentence in refused
    text = b"a " * ((MAX_BODY_BYTES - 4 - 8) // 2)  # with its length and max_new_tokens: the bound
    at = _grpc_stream(server, {"text_input": np.array([text], dtype=object),
                               "max_new_tokens": np.array([2], np.int64)})
    assert "tokens, more than the 100 tokens" in at[0]  # at the body bound: on to the prompt bound
    events = _http_stream(server, {"text_input": "The weather in Paris", "max_new_tokens": 6})
    assert "".join(e["text_output"] for e in events) == onnx_model.generate("The weather in Paris",
                                                                           max_new_tokens=6)
    assert [int(a[0]) for a in _grpc_stream(server, _ids([5, 6, 7], max_new_tokens=4))] == \
        _alone(onnx_model, [5, 6, 7], 4)


def test_this_tritonserver_has_no_http_body_flag_so_the_model_bounds_requests():
    """The wheel's Triton 2.51 (24.10) refuses --http-max-input-size (Triton 2.59, 25.06, added
    it), so the server above runs without it and the model's bound is what refuses. A wheel whose
    server takes the flag fails this test: then give the server body_flags(MAX_BODY_BYTES) too."""
    root = tritonserver.wheel_root()
    if root is None:
        pytest.skip("nvidia-pytriton (the wheel with tritonserver) is not installed.")
    env = {**os.environ, "LD_LIBRARY_PATH": str(root.parent / "nvidia_pytriton.libs")}
    binary = root / "tritonserver" / "bin" / "tritonserver"
    started = subprocess.run([str(binary), *body_flags(MAX_BODY_BYTES), "--model-repository=/nonexistent"],
                             capture_output=True, text=True, env=env, timeout=60, check=False)
    assert started.returncode == 1 and "unrecognized option '--http-max-input-size" in started.stderr
