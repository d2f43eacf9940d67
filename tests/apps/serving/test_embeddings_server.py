"""/v1/embeddings on 127.0.0.1 over a sentence-transformers model read by from_hf and exported:
the official ``openai`` client (base64, as it asks by default, and float) gets the vectors
``SentenceTransformer.encode`` gives; token-id inputs, ``dimensions`` and the usage; 32
concurrent clients each get their own vectors, run together; token ids as LangChain's
``OpenAIEmbeddings`` sends them; ``/v1/models``, ``/tokenize`` and ``/tokenizer_info`` as vLLM's;
limits and the wrong endpoint answer 400 with a sentence and the server keeps serving."""

from __future__ import annotations

import base64
import re
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import openai
import pytest

from tests.apps.serving.answer_schema import assert_answer_fits_its_schema
from transformer_kit.apps.serving.http import create_app
from transformer_kit.apps.serving.http import serve_in_thread as running
from transformer_kit.runtime import Engine

TEXTS = ["the quick brown fox jumps over the lazy dog", "paris is the capital of france",
         "search engines rank documents", "cats"]


@pytest.fixture(scope="module")
def server(embedding_export):
    _, om = embedding_export
    engine = Engine(om, max_wait_s=0.02)  # a wide window: concurrent clients meet in it
    with running(create_app(engine, "tiny-embed")) as url:
        yield url, engine
    engine.close()


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)


def _vectors(response) -> np.ndarray:
    """(n, dim) from a response; base64 that the client did not decode (it decodes only when it
    chose the format itself) read as little-endian float32."""
    assert [d.index for d in response.data] == list(range(len(response.data)))
    return np.array([np.frombuffer(base64.b64decode(d.embedding), "<f4") if isinstance(d.embedding, str)
                     else d.embedding for d in response.data], np.float32)


def _metric(url: str, name: str) -> float:
    return float(re.search(rf"^{name} (\S+)$", httpx.get(f"{url}/metrics").text, re.M).group(1))


def _reference(st, texts: list[str], dimensions: int | None = None) -> np.ndarray:
    """sentence-transformers' vectors; cut ones normalised again (the model normalises)."""
    return st.encode(texts, truncate_dim=dimensions, normalize_embeddings=dimensions is not None)


def test_the_openai_client_gets_sentence_transformers_vectors_in_base64_and_float(server, embedding_export):
    url, _ = server
    st, om = embedding_export
    client = _client(url)
    assert [m.id for m in client.models.list().data] == ["tiny-embed"]
    expected = _reference(st, TEXTS)
    tokens = sum(om.sentences.encode_inputs(TEXTS).token_counts)
    for encoding in (None, "float", "base64"):  # None: the client asks for base64 and decodes it
        kwargs = {} if encoding is None else {"encoding_format": encoding}
        response = client.embeddings.create(model="tiny-embed", input=TEXTS, **kwargs)
        np.testing.assert_allclose(_vectors(response), expected, atol=1e-5)
        assert response.usage.prompt_tokens == response.usage.total_tokens == tokens
        assert response.model == "tiny-embed"
    one = client.embeddings.create(model="tiny-embed", input=TEXTS[1])
    np.testing.assert_allclose(_vectors(one), expected[1:2], atol=1e-5)
    raw = httpx.post(f"{url}/v1/embeddings", json={"model": "tiny-embed", "input": "cats", "user": "u1"})
    assert raw.json()["object"] == "list" and raw.json()["data"][0]["object"] == "embedding"
    assert isinstance(raw.json()["data"][0]["embedding"], list)  # float is the default over HTTP


def test_token_ids_and_dimensions(server, embedding_export):
    url, _ = server
    st, om = embedding_export
    client = _client(url)
    ids = om.sentences.encode_inputs(TEXTS).tokens  # the texts' own ids: the same vectors
    response = client.embeddings.create(model="tiny-embed", input=ids, encoding_format="float")
    np.testing.assert_allclose(_vectors(response), _reference(st, TEXTS), atol=1e-5)
    assert response.usage.prompt_tokens == sum(map(len, ids))
    single = client.embeddings.create(model="tiny-embed", input=ids[0])
    np.testing.assert_allclose(_vectors(single), _reference(st, TEXTS[:1]), atol=1e-5)
    cut = _vectors(client.embeddings.create(model="tiny-embed", input=TEXTS, dimensions=8))
    assert cut.shape == (len(TEXTS), 8)
    np.testing.assert_allclose(cut, _reference(st, TEXTS, 8), atol=1e-5)
    np.testing.assert_allclose(cut, om.embed(TEXTS, dimensions=8), atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(cut, axis=1), 1.0, atol=1e-5)  # normalised again
    for fmt in ("float", "base64"):
        given = TEXTS[:2] if fmt == "float" else ids[:2]
        answer = httpx.post(f"{url}/v1/embeddings", timeout=60, json={
            "model": "tiny-embed", "input": given, "encoding_format": fmt}).json()
        assert_answer_fits_its_schema(url, "/v1/embeddings", answer)


def test_token_ids_as_langchains_openai_embeddings_sends_them(server, embedding_export):
    """LangChain's ``OpenAIEmbeddings`` (``check_embedding_ctx_length`` true, its default) sends
    each text's token ids, a list of id lists, through the openai client without
    ``encoding_format``: the client asks for base64 and decodes it."""
    url, _ = server
    st, om = embedding_export
    ids = om.sentences.encode_inputs(TEXTS).tokens
    response = _client(url).embeddings.create(model="tiny-embed", input=ids)  # LangChain's call
    assert all(isinstance(d.embedding, list) for d in response.data)  # decoded by the client
    np.testing.assert_allclose(_vectors(response), _reference(st, TEXTS), atol=1e-5)
    for given, texts in ((ids, TEXTS), (ids[1], TEXTS[1:2])):  # a list of lists, one list
        for encoding in ("base64", "float"):
            raw = httpx.post(f"{url}/v1/embeddings", json={"model": "tiny-embed", "input": given,
                                                           "encoding_format": encoding}).json()
            vectors = [np.frombuffer(base64.b64decode(d["embedding"]), "<f4") if encoding == "base64"
                       else d["embedding"] for d in raw["data"]]
            np.testing.assert_allclose(vectors, _reference(st, texts), atol=1e-5)
            assert raw["usage"]["prompt_tokens"] == sum(map(len, given if given is ids else [given]))
    # tiktoken's ids (LangChain's default tokenizer) are another vocabulary's: past this one, refused
    tiktokens = httpx.post(f"{url}/v1/embeddings", json={"model": "tiny-embed", "input": [[15339, 1917]]})
    assert tiktokens.status_code == 400
    assert "outside the vocabulary (0..185); token ids are this model's tokenizer's: give the text " \
        "instead" in tiktokens.json()["error"]["message"]


def test_the_model_and_its_tokenizer_are_described_as_vllm_describes_them(server, embedding_export):
    from tests.apps.serving.test_tokenization import LOADER, vllm_tokenizer_info

    url, _ = server
    st, om = embedding_export
    card = httpx.get(f"{url}/v1/models").json()["data"][0]
    assert card["root"] == str(om.path.resolve()) and card["parent"] is None
    assert card["max_model_len"] == st.max_seq_length == 24  # sentence-transformers' bound, as vLLM's
    tokenize = httpx.post(f"{url}/tokenize", json={"prompt": "cats"}).json()
    assert tokenize["max_model_len"] == 24
    info = httpx.get(f"{url}/tokenizer_info").json()
    expected, loader_only = vllm_tokenizer_info(om.path)
    assert info["tokenizer_class"] == "BertTokenizer" and "chat_template" not in info
    assert {key: value for key, value in info.items() if key not in LOADER} == expected
    assert set(loader_only) <= set(LOADER)


def test_32_concurrent_clients_each_get_their_own_vectors_run_together(server, embedding_export):
    url, engine = server
    st, _ = embedding_export
    words = " ".join(TEXTS).split()
    rng = np.random.default_rng(0)
    cases = [([" ".join(rng.choice(words, int(rng.integers(1, 12)))) + f" {i}" for _ in range(1 + i % 3)],
              [None, 8, 16][i % 3]) for i in range(32)]

    def ask(case: tuple[list[str], int | None]) -> np.ndarray:
        texts, dimensions = case
        kwargs = {} if dimensions is None else {"dimensions": dimensions}
        return _vectors(_client(url).embeddings.create(model="tiny-embed", input=texts, **kwargs))

    with ThreadPoolExecutor(len(cases)) as clients:
        results = list(clients.map(ask, cases, timeout=120))
    for (texts, dimensions), vectors in zip(cases, results, strict=True):
        np.testing.assert_allclose(vectors, _reference(st, texts, dimensions), atol=1e-5)
    assert engine.stats.max_batch_size > 1  # some call ran several clients' requests
    assert _metric(url, "transformer_kit_max_batch_size") == engine.stats.max_batch_size
    assert _metric(url, 'transformer_kit_encoder_requests_total{endpoint="embeddings"}') >= 32


@pytest.mark.parametrize(("body", "message"), [
    ({"input": []}, "input is an empty list"),
    ({"input": ["fine", ""]}, "input[1] is an empty string"),
    ({"input": [[2, 3], []]}, "input[1] is an empty token id list"),
    ({"input": ["a"] * 2049}, "at most 2048 per request"),
    ({"input": ["cats", "the quick brown fox " * 10]}, "input[1] is 42 tokens long"),
    ({"input": [[5] * 25]}, "input[0] is 25 tokens long; this model takes at most 24"),
    ({"input": [[5, 999]]}, "token id 999"),
    ({"input": "cats", "dimensions": 33}, "dimensions is 33"),
    ({"input": "cats", "dimensions": 0}, "dimensions"),
    ({"input": "cats", "encoding_format": "binary"}, "encoding_format"),
    ({"input": "cats", "truncate": True}, "Unknown field 'truncate'"),
    ({"input": [1.5]}, "input"),
])
def test_bad_requests_get_400_with_a_sentence_and_the_server_keeps_serving(server, body, message):
    url, _ = server
    response = httpx.post(f"{url}/v1/embeddings", json={"model": "tiny-embed", **body})
    assert response.status_code == 400, response.text
    assert message in response.json()["error"]["message"]
    good = httpx.post(f"{url}/v1/embeddings", json={"model": "tiny-embed", "input": "cats"})
    assert good.status_code == 200 and len(good.json()["data"][0]["embedding"]) == 32


def test_other_models_and_endpoints_are_refused_with_the_one_it_serves(server):
    url, _ = server
    other = httpx.post(f"{url}/v1/embeddings", json={"model": "other", "input": "cats"})
    assert other.status_code == 404 and "'other' does not exist" in other.json()["error"]["message"]
    for path, body in [("/v1/rerank", {"model": "tiny-embed", "query": "q", "documents": ["d"]}),
                       ("/v1/completions", {"model": "tiny-embed", "prompt": "q"}),
                       ("/v1/chat/completions", {"model": "tiny-embed", "messages": []}),
                       ("/v1/responses", {"model": "tiny-embed", "input": "q"})]:
        response = httpx.post(f"{url}{path}", json=body)
        assert response.status_code == 400, response.text
        assert "a sentence-embedding model" in response.json()["error"]["message"]
        assert "POST /v1/embeddings" in response.json()["error"]["message"]
    assert httpx.get(f"{url}/health").json() == {"status": "ok"}


def test_a_generators_server_refuses_embeddings(onnx_model):
    from transformer_kit.runtime import Engine

    engine = Engine(onnx_model, start=False)
    with running(create_app(engine, "tiny")) as url:
        response = httpx.post(f"{url}/v1/embeddings", json={"model": "tiny", "input": "cats"})
        assert response.status_code == 400
        assert "text generator" in response.json()["error"]["message"]
        assert "/v1/completions" in response.json()["error"]["message"]
    engine.close()


def test_a_full_queue_answers_503(embedding_export):
    _, om = embedding_export
    engine = Engine(om, max_queue=1, start=False)
    with running(create_app(engine, "tiny-embed")) as url:
        waiting = engine.submit_pooling([[2, 5, 3]], [[1, 1, 1]])  # fills the queue: not started
        response = httpx.post(f"{url}/v1/embeddings", json={"model": "tiny-embed", "input": "cats"})
        assert response.status_code == 503 and "max_queue" in response.json()["error"]["message"]
        engine.start()
        assert waiting.wait(30) and waiting.finish_reason == "stop"
        np.testing.assert_allclose(waiting.rows, om.embed([[2, 5, 3]]), atol=1e-5)
        assert httpx.post(f"{url}/v1/embeddings",
                          json={"model": "tiny-embed", "input": "cats"}).status_code == 200
        assert 'transformer_kit_requests_total{outcome="queue_full"} 1.0' in httpx.get(f"{url}/metrics").text
    engine.close()


def test_a_failed_run_fails_its_requests_and_the_engine_goes_on(embedding_export):
    st, om = embedding_export
    engine = Engine(om)
    run = om.run_embedding

    def once(*args):  # the first run fails, as onnxruntime might
        om.run_embedding = run
        raise RuntimeError("the model failed")

    om.run_embedding = once
    with running(create_app(engine, "tiny-embed")) as url:
        failed = httpx.post(f"{url}/v1/embeddings", json={"model": "tiny-embed", "input": "cats"})
        assert failed.status_code == 500 and "the model failed" in failed.json()["error"]["message"]
        good = httpx.post(f"{url}/v1/embeddings", json={"model": "tiny-embed", "input": ["cats"]})
        np.testing.assert_allclose([good.json()["data"][0]["embedding"]], _reference(st, ["cats"]),
                                   atol=1e-5)
    engine.close()
