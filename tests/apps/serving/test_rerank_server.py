"""/v1/rerank (and /rerank, /v2/rerank) on 127.0.0.1 over a cross-encoder read by from_hf and exported: the
relevance scores equal sentence-transformers' ``CrossEncoder.predict``, best first, ``top_n`` and
``return_documents`` as Cohere and Jina take them; concurrent clients' pairs run together;
limits and the wrong endpoint answer 400 with a sentence and the server keeps serving."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

from tests.apps.serving.answer_schema import assert_answer_fits_its_schema
from transformer_kit.apps.serving.http import create_app
from transformer_kit.apps.serving.http import serve_in_thread as running
from transformer_kit.runtime import Engine

QUERY = "what is the capital of france"
DOCUMENTS = ["paris is the capital of france", "the quick brown fox", "search engines rank documents",
             "cats and dogs", "france"]


@pytest.fixture(scope="module")
def server(cross_encoder_export):
    _, om = cross_encoder_export
    engine = Engine(om, max_wait_s=0.02)
    with running(create_app(engine, "tiny-rerank")) as url:
        yield url, engine
    engine.close()


def _rerank(url: str, path: str = "/v1/rerank", **body) -> httpx.Response:
    return httpx.post(f"{url}{path}", json={"model": "tiny-rerank", **body}, timeout=60)


def test_scores_equal_the_cross_encoders_best_first(server, cross_encoder_export):
    url, _ = server
    ce, om = cross_encoder_export
    expected = ce.predict([(QUERY, d) for d in DOCUMENTS])
    response = _rerank(url, query=QUERY, documents=DOCUMENTS)
    assert response.status_code == 200, response.text
    body = response.json()
    results = body["results"]
    assert sorted(r["index"] for r in results) == list(range(len(DOCUMENTS)))
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True)
    np.testing.assert_allclose(scores, expected[[r["index"] for r in results]], atol=1e-5)
    assert [r["index"] for r in results] == np.argsort(-expected, kind="stable").tolist()
    assert all("document" not in r for r in results) and body["model"] == "tiny-rerank"
    tokens, _ = om.sentences.text_encoder.encode_pairs(QUERY, DOCUMENTS)
    assert body["usage"]["total_tokens"] == sum(map(len, tokens)) and body["id"].startswith("rerank-")
    for path in ("/rerank", "/v2/rerank"):  # vLLM's three paths (v2: Cohere's v2 client's)
        top = _rerank(url, path, query=QUERY, documents=DOCUMENTS, top_n=2, return_documents=True)
        assert top.json()["results"] == [{**r, "document": {"text": DOCUMENTS[r["index"]]}}
                                         for r in results[:2]]
        assert_answer_fits_its_schema(url, path, top.json())
    assert_answer_fits_its_schema(url, "/v1/rerank", body)


def test_concurrent_clients_each_get_their_own_scores_run_together(server, cross_encoder_export):
    url, engine = server
    ce, _ = cross_encoder_export
    cases = [(f"{QUERY} {i}", [*DOCUMENTS[i % 5:], f"document {i}"]) for i in range(16)]

    def ask(case: tuple[str, list[str]]) -> list[dict]:
        return _rerank(url, query=case[0], documents=case[1]).json()["results"]

    with ThreadPoolExecutor(len(cases)) as clients:
        answers = list(clients.map(ask, cases, timeout=120))
    for (query, documents), results in zip(cases, answers, strict=True):
        scores = np.array([r["relevance_score"] for r in sorted(results, key=lambda r: r["index"])])
        np.testing.assert_allclose(scores, ce.predict([(query, d) for d in documents]), atol=1e-5)
    assert engine.stats.max_batch_size > 1


@pytest.mark.parametrize(("body", "message"), [
    ({"query": QUERY, "documents": []}, "documents is an empty list"),
    ({"query": " ", "documents": ["a"]}, "query is empty"),
    ({"query": QUERY, "documents": ["a", ""]}, "documents[1] is empty"),
    ({"query": QUERY, "documents": ["a"] * 1001}, "at most 1000 per request"),
    ({"query": QUERY, "documents": ["a"], "top_n": 0}, "top_n"),
    ({"query": QUERY, "documents": [{"text": "a"}]}, "documents"),
    ({"query": QUERY, "documents": ["a"], "rank_fields": ["text"]}, "Unknown field 'rank_fields'"),
])
def test_bad_requests_get_400_with_a_sentence_and_the_server_keeps_serving(server, body, message):
    url, _ = server
    response = _rerank(url, **body)
    assert response.status_code == 400, response.text
    assert message in response.json()["error"]["message"]
    assert _rerank(url, query=QUERY, documents=["a"]).status_code == 200


def test_a_long_pair_is_cut_as_the_cross_encoder_cuts_it(server, cross_encoder_export):
    url, _ = server
    ce, om = cross_encoder_export
    long = "the quick brown fox jumps over the lazy dog " * 8  # far past the 24 tokens a pair takes
    body = _rerank(url, query=QUERY, documents=[long, "cats"]).json()
    assert body["usage"]["total_tokens"] <= 2 * om.sentences.text_encoder.max_tokens
    scores = [r["relevance_score"] for r in sorted(body["results"], key=lambda r: r["index"])]
    np.testing.assert_allclose(scores, ce.predict([(QUERY, long), (QUERY, "cats")]), atol=1e-5)


def test_embeddings_on_a_cross_encoder_are_refused_with_the_one_it_serves(server, cross_encoder_export):
    url, _ = server
    response = httpx.post(f"{url}/v1/embeddings", json={"model": "tiny-rerank", "input": "cats"})
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert "a cross-encoder" in message and "POST /v1/rerank and /rerank and /v2/rerank" in message
    card = httpx.get(f"{url}/v1/models").json()["data"][0]
    assert card["id"] == "tiny-rerank"
    assert card["max_model_len"] == cross_encoder_export[1].sentences.text_encoder.max_tokens == 24
