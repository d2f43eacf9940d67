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
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

from transformer_kit.apps.serving.openai_api import ServerMetrics, failure_response, unknown_model
from transformer_kit.core.errors import InputError
from transformer_kit.runtime import QueueFull, Service


class EmbeddingRequest(BaseModel):
    """The body of ``POST /v1/embeddings``: OpenAI's fields; any other field is refused (400)."""

    model_config = ConfigDict(extra="forbid")

    model: str
    input: StrictStr | list[StrictStr] | list[StrictInt] | list[list[StrictInt]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)
    user: str | None = None


def _encoded(vector: np.ndarray, encoding_format: str) -> list[float] | str:
    """One vector (dim,) as a list of numbers or as base64 of its little-endian float32 bytes."""
    if encoding_format == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector.tolist()


class EmbeddingServer:
    """``/v1/embeddings`` over ``service`` (an embedding model's), serving ``model_name``."""

    def __init__(self, service: Service, model_name: str, metrics: ServerMetrics) -> None:
        self.service, self.model_name, self.metrics = service, model_name, metrics

    async def embeddings(self, body: EmbeddingRequest) -> Any:
        if body.model != self.model_name:
            return unknown_model(body.model, self.model_name)
        try:  # tokenizing off the loop
            job = await asyncio.to_thread(self.service.embed, body.input, dimensions=body.dimensions)
            await job.request.finished()
            if (failed := failure_response(job.failure)) is not None:
                return failed
            vectors = job.vectors()
        except (QueueFull, InputError) as exc:
            return self.metrics.refused(exc)
        self.metrics.served("embeddings", job.tokens)
        data = [{"object": "embedding", "index": i, "embedding": _encoded(v, body.encoding_format)}
                for i, v in enumerate(vectors)]
        return JSONResponse({"object": "list", "data": data, "model": self.model_name,
                             "usage": {"prompt_tokens": job.tokens, "total_tokens": job.tokens}})
