"""``POST /v1/embeddings`` in OpenAI's convention over the runtime's
:meth:`~transformer_kit.runtime.Service.embed`: texts or token ids in, sentence embeddings out,
each request batched with other clients' requests.

``input``: a string, a list of strings, a list of token ids or a list of id lists;
``encoding_format``: "float" (lists of numbers) or "base64" (each vector's little-endian
float32 bytes in base64, what the ``openai`` client asks for by default); ``dimensions``: keep
the first features (Matryoshka), normalised again when the model normalises, as
``OnnxModel.embed(dimensions=...)``; ``user`` is accepted and ignored.

Limits (400 with a sentence, never silent; the service's): at most ``max_inputs`` inputs; no
empty string or id list; no input longer than the model's ``max_tokens`` (text is measured
before any cut, as OpenAI refuses an over-long input rather than embed part of it).
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any, Literal

import numpy as np
from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

from transformer_kit.apps.serving.openai_api import failure_response
from transformer_kit.apps.serving.routes import Family, Served, Unanswered, endpoint


class EmbeddingRequest(BaseModel):
    """The body of ``POST /v1/embeddings``: OpenAI's fields; any other field is refused (400)."""

    model_config = ConfigDict(extra="forbid")

    model: str
    input: StrictStr | list[StrictStr] | list[StrictInt] | list[list[StrictInt]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)
    user: str | None = None


class Embedding(BaseModel):
    """One input's vector: numbers, or with ``encoding_format`` "base64" its float32 bytes."""

    object: Literal["embedding"]
    index: int = Field(ge=0)
    embedding: list[float] | str


class EmbeddingUsage(BaseModel):
    prompt_tokens: int = Field(ge=0)
    total_tokens: int = Field(ge=0)


class EmbeddingList(BaseModel):
    """The answer of ``POST /v1/embeddings``: a vector per input, in order."""

    object: Literal["list"]
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage


def _encoded(vector: np.ndarray, encoding_format: str) -> list[float] | str:
    """One vector (dim,) as a list of numbers or as base64 of its little-endian float32 bytes."""
    if encoding_format == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector.tolist()


class EmbeddingServer:
    """``/v1/embeddings`` over ``service`` (an embedding model's), serving ``model_name``."""

    def __init__(self, served: Served) -> None:
        self.service, self.model_name, self.metrics = served.service, served.name, served.metrics

    @endpoint
    async def embeddings(self, body: EmbeddingRequest, request: Request) -> Any:
        # tokenizing off the loop
        job = await asyncio.to_thread(self.service.embed, body.input, dimensions=body.dimensions)
        await job.request.finished()
        if (failed := failure_response(job.failure)) is not None:
            raise Unanswered(failed)
        vectors = job.vectors()
        self.metrics.served("embeddings", job.tokens)
        data = [{"object": "embedding", "index": i, "embedding": _encoded(v, body.encoding_format)}
                for i, v in enumerate(vectors)]
        return JSONResponse({"object": "list", "data": data, "model": self.model_name,
                             "usage": {"prompt_tokens": job.tokens, "total_tokens": job.tokens}})


ROUTES = Family(EmbeddingServer, EmbeddingServer.embeddings, ("/v1/embeddings",), EmbeddingRequest,
                EmbeddingList)
