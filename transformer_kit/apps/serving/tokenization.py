"""``POST /tokenize`` and ``POST /detokenize`` as vLLM serves them, with the export's tokenizer
(:meth:`~transformer_kit.runtime.Service.tokenize`).

``/tokenize`` takes a ``prompt`` (text, with the tokenizer's special tokens unless
``add_special_tokens`` is false) or chat ``messages`` (rendered by the export's chat template,
``add_generation_prompt`` true by default, special tokens not added again by default: the
template writes its own; ``tools`` and ``chat_template_kwargs`` as a chat takes them) and answers
``{"count", "max_model_len", "tokens"}`` (and ``token_strs`` with ``return_token_strs``): the ids
a completion or a chat request with that input is given. ``/detokenize`` takes ``tokens`` and
answers ``{"prompt"}``, their text (special tokens skipped, as a reply's). ``GET
/tokenizer_info`` answers the tokenizer's configuration as vLLM's does
(:func:`tokenizer_info`). Bad input (both or
neither of prompt and messages, an id outside the vocabulary, a wrong type) is 400 with a
sentence. The chat template renders in a worker thread, off the event loop.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field, StrictInt

from transformer_kit.apps.serving.chat import ChatMessage
from transformer_kit.apps.serving.openai_api import error_response
from transformer_kit.apps.serving.routes import Family, Served, endpoint
from transformer_kit.core.errors import TransformerKitError
from transformer_kit.runtime import Service


class TokenizeRequest(BaseModel):
    """The body of ``POST /tokenize`` (vLLM's completion and chat forms in one): ``prompt`` or
    ``messages``."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    #: None: true for a prompt, false for messages (vLLM's defaults).
    add_special_tokens: bool | None = None
    add_generation_prompt: bool = True
    tools: list[dict[str, Any]] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_strs: bool = False


class DetokenizeRequest(BaseModel):
    """The body of ``POST /detokenize``: token ids."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    tokens: list[StrictInt]


class Tokenized(BaseModel):
    """The answer of ``POST /tokenize``: the ids (and with ``return_token_strs`` their
    strings), their count and the model's ``max_model_len``."""

    count: int = Field(ge=0)
    max_model_len: int | None
    tokens: list[int]
    token_strs: list[str] | None = None


class Detokenized(BaseModel):
    """The answer of ``POST /detokenize``: the ids' text."""

    prompt: str


def max_model_len(service: Service) -> int | None:
    """The most tokens one sequence may take, as vLLM's ``max_model_len``: a decoder's context
    length (prompt and reply together; None when the export does not say), an encoder's bound
    on one input (sentence-transformers' ``max_seq_length``, which vLLM reads too)."""
    if service.kind in ("generate", "transcribe"):
        return service.model.context_length
    return service.max_input_tokens


class TokenizationServer:
    """``/tokenize`` and ``/detokenize`` over one served model's service (a request that names
    no model is the base's, as vLLM's)."""

    def __init__(self, served: Served) -> None:
        self.service, self.model_name, self.metrics = served.service, served.name, served.metrics

    @endpoint
    async def tokenize(self, body: TokenizeRequest, request: Request) -> Any:
        messages = None if body.messages is None else [m.model_dump(exclude_none=True)
                                                       for m in body.messages]
        try:
            ids, strings = await asyncio.to_thread(
                self.service.tokenize, body.prompt, messages,
                add_special_tokens=body.add_special_tokens,
                add_generation_prompt=body.add_generation_prompt, tools=body.tools,
                template_kwargs=body.chat_template_kwargs, token_strs=body.return_token_strs)
        except TransformerKitError as exc:
            return error_response(400, str(exc))
        answer: dict[str, Any] = {"count": len(ids), "max_model_len": max_model_len(self.service),
                                  "tokens": ids}
        if strings is not None:
            answer["token_strs"] = strings
        return answer

    @endpoint
    async def detokenize(self, body: DetokenizeRequest, request: Request) -> Any:
        try:
            return {"prompt": self.service.detokenize(body.tokens)}
        except TransformerKitError as exc:
            return error_response(400, str(exc), param="tokens")

    async def tokenizer_info(self) -> Any:
        """``GET /tokenizer_info``: :meth:`Service.tokenizer_info` of the export's tokenizer (400 with a
        sentence for an export without one)."""
        try:
            return self.service.tokenizer_info()
        except TransformerKitError as exc:
            return error_response(400, str(exc))


TOKENIZE = Family(TokenizationServer, TokenizationServer.tokenize, ("/tokenize",), TokenizeRequest,
                  Tokenized)
DETOKENIZE = Family(TokenizationServer, TokenizationServer.detokenize, ("/detokenize",),
                    DetokenizeRequest, Detokenized)
