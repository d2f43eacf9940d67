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

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StrictStr

from transformer_kit.apps.serving.openai_api import failure_response
from transformer_kit.apps.serving.routes import Family, Served, Unanswered, endpoint


class RerankRequest(BaseModel):
    """The body of ``POST /v1/rerank``; any other field is refused (400)."""

    model_config = ConfigDict(extra="forbid")

    model: str
    query: StrictStr
    documents: list[StrictStr]
    top_n: int | None = Field(None, ge=1)
    return_documents: bool = False


class RerankDocument(BaseModel):
    text: str


class RerankResult(BaseModel):
    """One document's place: its index in the request, its score, its text when asked for."""

    index: int = Field(ge=0)
    relevance_score: float
    document: RerankDocument | None = None


class RerankUsage(BaseModel):
    total_tokens: int = Field(ge=0)


class Ranking(BaseModel):
    """The answer of ``POST /v1/rerank``: the documents, most relevant first."""

    id: str
    model: str
    results: list[RerankResult]
    usage: RerankUsage


class RerankServer:
    """``/v1/rerank`` over ``service`` (a cross-encoder's), serving ``model_name``."""

    def __init__(self, served: Served) -> None:
        self.service, self.model_name, self.metrics = served.service, served.name, served.metrics

    @endpoint
    async def rerank(self, body: RerankRequest, request: Request) -> Any:
        # tokenizing off the loop
        job = await asyncio.to_thread(self.service.rerank, body.query, body.documents,
                                      top_n=body.top_n)
        await job.request.finished()
        if (failed := failure_response(job.failure)) is not None:
            raise Unanswered(failed)
        results = []
        for i, score in job.ranking():
            result: dict[str, Any] = {"index": i, "relevance_score": score}
            if body.return_documents:
                result["document"] = {"text": body.documents[i]}
            results.append(result)
        self.metrics.served("rerank", job.tokens)
        return JSONResponse({"id": f"rerank-{uuid.uuid4().hex}", "model": self.model_name,
                             "results": results, "usage": {"total_tokens": job.tokens}})


#: vLLM's three paths (Jina's, Cohere's v1 and v2).
ROUTES = Family(RerankServer, RerankServer.rerank, ("/v1/rerank", "/rerank", "/v2/rerank"),
                RerankRequest, Ranking)
