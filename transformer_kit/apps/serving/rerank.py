"""``POST /v1/rerank`` (also ``/rerank``) in the Cohere / Jina convention over the runtime's
:meth:`~transformer_kit.runtime.Service.rerank` of a cross-encoder: a query and documents in, the documents by
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

from transformer_kit.apps.serving.openai_api import ServerMetrics, failure_response, unknown_model
from transformer_kit.core.errors import InputError
from transformer_kit.runtime import QueueFull, Service


class RerankRequest(BaseModel):
    """The body of ``POST /v1/rerank``; any other field is refused (400)."""

    model_config = ConfigDict(extra="forbid")

    model: str
    query: StrictStr
    documents: list[StrictStr]
    top_n: int | None = Field(None, ge=1)
    return_documents: bool = False


class RerankServer:
    """``/v1/rerank`` over ``service`` (a cross-encoder's), serving ``model_name``."""

    def __init__(self, service: Service, model_name: str, metrics: ServerMetrics) -> None:
        self.service, self.model_name, self.metrics = service, model_name, metrics

    async def rerank(self, body: RerankRequest) -> Any:
        if body.model != self.model_name:
            return unknown_model(body.model, self.model_name)
        try:  # tokenizing off the loop
            job = await asyncio.to_thread(self.service.rerank, body.query, body.documents,
                                          top_n=body.top_n)
            await job.request.finished()
        except (QueueFull, InputError) as exc:
            return self.metrics.refused(exc)
        if (failed := failure_response(job.failure)) is not None:
            return failed
        results = []
        for i, score in job.ranking():
            result: dict[str, Any] = {"index": i, "relevance_score": score}
            if body.return_documents:
                result["document"] = {"text": body.documents[i]}
            results.append(result)
        self.metrics.served("rerank", job.tokens)
        return JSONResponse({"id": f"rerank-{uuid.uuid4().hex}", "model": self.model_name,
                             "results": results, "usage": {"total_tokens": job.tokens}})
