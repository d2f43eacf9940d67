"""``POST /v1/rerank`` (also ``/rerank``) in the Cohere / Jina convention over an
:class:`.EmbeddingEngine` of a cross-encoder: a query and documents in, the documents by
relevance out, best first; the (query, document) pairs batched with other clients' pairs.

``{"model", "query", "documents": [str], "top_n"?, "return_documents"? (false)}`` ->
``{"id", "model", "results": [{"index", "relevance_score", "document": {"text"} (with
return_documents)}], "usage": {"total_tokens"}}``. A pair longer than the model's
``max_tokens`` is cut longest first, as ``CrossEncoder.predict`` (and Cohere) cut it;
``total_tokens`` counts the tokens after the cut.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StrictStr

from transformer_kit.apps.serving.embedding_engine import EmbeddingEngine
from transformer_kit.apps.serving.engine import QueueFull
from transformer_kit.apps.serving.openai_api import ServerMetrics, error_response
from transformer_kit.errors import InputError

#: Documents per request by default (Cohere's recommended most).
MAX_DOCUMENTS = 1000


class RerankRequest(BaseModel):
    """The body of ``POST /v1/rerank``; any other field is refused (400)."""

    model_config = ConfigDict(extra="forbid")

    model: str
    query: StrictStr
    documents: list[StrictStr]
    top_n: int | None = Field(None, ge=1)
    return_documents: bool = False


class RerankServer:
    """``/v1/rerank`` over ``engine`` (a cross-encoder's), serving ``model_name``.

    Args:
        max_documents: most documents in one request.
    """

    def __init__(self, engine: EmbeddingEngine, model_name: str, metrics: ServerMetrics, *,
                 max_documents: int = MAX_DOCUMENTS) -> None:
        self.engine, self.model_name, self.metrics = engine, model_name, metrics
        self.max_documents = max_documents

    def check(self, body: RerankRequest) -> None:
        """InputError for an empty query, no documents, too many, or an empty one."""
        if not body.query.strip():
            raise InputError("query is empty; give the text to rank the documents against.")
        if not body.documents:
            raise InputError("documents is an empty list; give at least one document to rank.")
        if len(body.documents) > self.max_documents:
            raise InputError(f"documents holds {len(body.documents)} documents; this server takes at "
                             f"most {self.max_documents} per request. Split them over several "
                             "requests and merge the rankings by relevance_score.")
        empty = [i for i, d in enumerate(body.documents) if not d.strip()]
        if empty:
            raise InputError(f"documents[{empty[0]}] is empty; every document needs some text. "
                             "Leave it out.")

    async def rerank(self, body: RerankRequest) -> Any:
        if body.model != self.model_name:
            return error_response(404, f"The model {body.model!r} does not exist here; this server "
                                  f"serves {self.model_name!r} (GET /v1/models).", param="model")
        try:
            self.check(body)
            tokens, types = await asyncio.to_thread(self.engine.model.text_encoder.encode_pairs,
                                                    body.query, body.documents)
            job = self.engine.submit(tokens, types)
            scores = (await asyncio.wrap_future(job.future))[:, 0]  # (n,) one label
        except (QueueFull, InputError) as exc:
            return self.metrics.refused(exc)
        order = sorted(range(len(scores)), key=lambda i: (-float(scores[i]), i))[:body.top_n]
        results = []
        for i in order:
            result: dict[str, Any] = {"index": i, "relevance_score": float(scores[i])}
            if body.return_documents:
                result["document"] = {"text": body.documents[i]}
            results.append(result)
        total = sum(map(len, tokens))
        self.metrics.served("rerank", total)
        return JSONResponse({"id": f"rerank-{uuid.uuid4().hex}", "model": self.model_name,
                             "results": results, "usage": {"total_tokens": total}})
