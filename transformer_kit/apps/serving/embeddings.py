"""``POST /v1/embeddings`` in OpenAI's convention over an :class:`.EmbeddingEngine`: texts or
token ids in, sentence embeddings out, each request batched with other clients' requests.

``input``: a string, a list of strings, a list of token ids or a list of id lists;
``encoding_format``: "float" (lists of numbers) or "base64" (each vector's little-endian
float32 bytes in base64, what the ``openai`` client asks for by default); ``dimensions``: keep
the first features (Matryoshka), normalised again when the model normalises, as
``OnnxModel.embed(dimensions=...)``; ``user`` is accepted and ignored.

Limits (400 with a sentence, never silent): at most ``max_inputs`` inputs; no empty string or
id list; no input longer than the model's ``max_tokens`` (text is measured before any cut, as
OpenAI refuses an over-long input rather than embed part of it).
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any, Literal

import numpy as np
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

from transformer_kit.apps.serving.embedding_engine import EmbeddingEngine
from transformer_kit.apps.serving.engine import QueueFull
from transformer_kit.apps.serving.openai_api import ServerMetrics, error_response
from transformer_kit.embedding import EmbeddingInputs, TextEncoder
from transformer_kit.errors import InputError

#: Inputs per request by default (OpenAI's limit).
MAX_INPUTS = 2048
#: The measuring encoder's cut: far beyond any model, so a text's full length is seen.
_UNCUT = 1 << 30


class EmbeddingRequest(BaseModel):
    """The body of ``POST /v1/embeddings``: OpenAI's fields; any other field is refused (400)."""

    model_config = ConfigDict(extra="forbid")

    model: str
    input: StrictStr | list[StrictStr] | list[StrictInt] | list[list[StrictInt]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)
    user: str | None = None


def _l2_normalize(x: np.ndarray) -> np.ndarray:
    """Rows (n, dim) divided by max(their L2 norm, 1e-12), as ``OnnxModel.embed`` does."""
    return (x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)).astype(np.float32)


def _encoded(vector: np.ndarray, encoding_format: str) -> list[float] | str:
    """One vector (dim,) as a list of numbers or as base64 of its little-endian float32 bytes."""
    if encoding_format == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector.tolist()


class EmbeddingServer:
    """``/v1/embeddings`` over ``engine`` (an embedding model's), serving ``model_name``.

    Args:
        max_inputs: most inputs in one request.
    """

    def __init__(self, engine: EmbeddingEngine, model_name: str, metrics: ServerMetrics, *,
                 max_inputs: int = MAX_INPUTS) -> None:
        self.engine, self.model_name, self.metrics = engine, model_name, metrics
        self.max_inputs = max_inputs
        model = engine.model
        settings, _ = model.embedding_settings()
        #: Inputs' tokens as the model runs them, with no cut: an over-long input is refused.
        self.measuring = TextEncoder(model.tokenizer, {**settings, "max_seq_length": _UNCUT}, None)
        #: Most tokens of one input (the model's max_seq_length or positional bound).
        self.max_tokens = model.text_encoder.max_tokens
        self.normalizes = bool((settings.get("sentence_embedding") or {}).get("normalize"))

    def inputs(self, given: Any) -> EmbeddingInputs:
        """The request's inputs as token ids; InputError for an empty, too long or too large one."""
        items = [given] if isinstance(given, str) or (given and isinstance(given[0], int)) else given
        if not items:
            raise InputError("input is an empty list; give a string, a list of strings, a list of "
                             "token ids or a list of id lists.")
        if len(items) > self.max_inputs:
            raise InputError(f"input holds {len(items)} inputs; this server takes at most "
                             f"{self.max_inputs} per request. Split them over several requests.")
        empty = [i for i, item in enumerate(items) if not item]
        if empty:
            what = "string" if isinstance(items[empty[0]], str) else "token id list"
            raise InputError(f"input[{empty[0]}] is an empty {what}; every input needs some text "
                             "or ids. Leave it out.")
        encoded, _ = self.measuring.encode(items)
        for i, count in enumerate(encoded.token_counts):
            if count > self.max_tokens:
                raise InputError(f"input[{i}] is {count} tokens long; this model takes at most "
                                 f"{self.max_tokens} tokens per input. Shorten it or split it.")
        return encoded

    def vectors(self, raw: np.ndarray, dimensions: int | None) -> np.ndarray:
        """The request's vectors (n, dimensions or dim): cut to ``dimensions`` and normalised
        again when the model normalises (as ``OnnxModel.embed(dimensions=...)``)."""
        if dimensions is None:
            return raw
        if dimensions > raw.shape[1]:
            raise InputError(f"dimensions is {dimensions}, but this model's embeddings have "
                             f"{raw.shape[1]}; give a number from 1 to {raw.shape[1]} or leave it out.")
        cut = np.ascontiguousarray(raw[:, :dimensions])
        return _l2_normalize(cut) if self.normalizes else cut

    async def embeddings(self, body: EmbeddingRequest) -> Any:
        if body.model != self.model_name:
            return error_response(404, f"The model {body.model!r} does not exist here; this server "
                                  f"serves {self.model_name!r} (GET /v1/models).", param="model")
        try:
            encoded = await asyncio.to_thread(self.inputs, body.input)  # tokenizing off the loop
            job = self.engine.submit(encoded.tokens, encoded.pooled)
            vectors = self.vectors(await asyncio.wrap_future(job.future), body.dimensions)
        except (QueueFull, InputError) as exc:
            return self.metrics.refused(exc)
        tokens = sum(encoded.token_counts)
        self.metrics.served("embeddings", tokens)
        data = [{"object": "embedding", "index": i, "embedding": _encoded(v, body.encoding_format)}
                for i, v in enumerate(vectors)]
        return JSONResponse({"object": "list", "data": data, "model": self.model_name,
                             "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})
