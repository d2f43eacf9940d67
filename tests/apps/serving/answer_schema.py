"""Checking an answer against the model the server's ``/openapi.json`` declares for it (the
fuzz test checks every answer of the chat server; this, the embedding and rerank servers')."""

from __future__ import annotations

import httpx
import jsonschema


def assert_answer_fits_its_schema(url: str, path: str, answer: dict) -> None:
    """``answer`` (a 200 of ``POST path``) fits the answer model ``/openapi.json`` declares for
    it (for the servers this test's chat server cannot stand for: embeddings, rerank)."""
    schema = httpx.get(f"{url}/openapi.json", timeout=30).json()
    declared = schema["paths"][path]["post"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert "$ref" in declared, declared  # a model, not an open object
    jsonschema.validate(answer, {**declared, "components": schema["components"]})
