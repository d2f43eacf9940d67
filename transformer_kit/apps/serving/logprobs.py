"""Log probability reports in the shapes clients read: chat's ``logprobs.content`` (OpenAI's
chat completions), the legacy completions' ``tokens`` / ``token_logprobs`` / ``top_logprobs`` /
``text_offset`` (what lm-evaluation-harness scores with), vLLM's ``prompt_logprobs``, and the
Responses API's ``output_text.logprobs``.

A token is written as its text and its ``bytes`` (a piece of a character has its own bytes, and
its text the replacement character); an export without a tokenizer writes ``token_id:N``, as
vLLM's ``return_tokens_as_token_ids``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from transformer_kit.core.decoding.logprobs import TokenLogprob
from transformer_kit.runtime import Service


class TokenWriter:
    """The text and bytes of token ids, read once per id from ``service``'s tokenizer (an export
    without one: ``token_id:N``)."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self._known: dict[int, tuple[str, bytes]] = {}

    def learn(self, reports: Iterable[TokenLogprob | None]) -> TokenWriter:
        """Read the ids of ``reports`` (their tokens and alternatives) in one call."""
        ids = {i for r in reports if r is not None for i in (r.token_id, *(t for t, _ in r.top))}
        self.read(ids)
        return self

    def read(self, ids: Iterable[int]) -> None:
        new = sorted(set(ids) - self._known.keys())
        if not new:
            return
        written = self.service.token_bytes(new)
        if written is None:
            self._known.update({i: (f"token_id:{i}", f"token_id:{i}".encode()) for i in new})
            return
        for i, raw in zip(new, written, strict=True):
            self._known[i] = (raw.decode("utf-8", errors="replace"), raw)

    def text(self, token: int) -> str:
        self.read([token])
        return self._known[token][0]

    def entry(self, token: int, logprob: float) -> dict[str, Any]:
        """``{"token", "logprob", "bytes"}`` as chat and the Responses API write a token."""
        self.read([token])
        text, raw = self._known[token]
        return {"token": text, "logprob": logprob, "bytes": list(raw)}


def chat_content(writer: TokenWriter, reports: list[TokenLogprob]) -> list[dict[str, Any]]:
    """Chat's ``logprobs.content`` (and the Responses API's ``logprobs``): one entry per token
    with its ``top_logprobs``, most likely first."""
    writer.learn(reports)
    return [{**writer.entry(r.token_id, r.logprob),
             "top_logprobs": [writer.entry(i, lp) for i, lp in r.top]} for r in reports]


def chat_logprobs(writer: TokenWriter, reports: list[TokenLogprob]) -> dict[str, Any]:
    """A chat choice's (or chunk's) ``logprobs`` object."""
    return {"content": chat_content(writer, reports), "refusal": None}


def completion_logprobs(writer: TokenWriter, ids: list[int], reports: list[TokenLogprob | None],
                        offset: int = 0) -> dict[str, Any]:
    """The legacy completions' ``logprobs``: each token's text, its log probability (None for a
    prompt's first token), the most likely tokens with the token itself among them (OpenAI's
    "as well as the chosen tokens"), and each token's offset in the choice's text, counting
    from ``offset`` (vLLM's: the lengths of the tokens' texts added up)."""
    writer.learn(reports)
    texts = [writer.text(i) for i in ids]
    offsets, at = [], offset
    for text in texts:
        offsets.append(at)
        at += len(text)
    tops: list[dict[str, float] | None] = []
    for r in reports:
        if r is None:
            tops.append(None)
            continue
        top = {writer.text(i): lp for i, lp in r.top}
        top.setdefault(writer.text(r.token_id), r.logprob)
        tops.append(top)
    return {"tokens": texts, "token_logprobs": [None if r is None else r.logprob for r in reports],
            "top_logprobs": tops, "text_offset": offsets}


def joined(first: dict[str, Any] | None, second: dict[str, Any]) -> dict[str, Any]:
    """Two legacy ``logprobs`` objects of consecutive tokens as one (an echoed prompt's, then
    the reply's)."""
    if first is None:
        return second
    return {key: first[key] + second[key] for key in second}


def prompt_report(writer: TokenWriter, reports: list[TokenLogprob | None]) -> list[dict | None]:
    """vLLM's ``prompt_logprobs``: per prompt token None (the first) or {id: {"logprob",
    "rank", "decoded_token"}}, the token itself and the most likely at its position."""
    writer.learn(reports)
    out: list[dict | None] = []
    for r in reports:
        if r is None:
            out.append(None)
            continue
        ranked = {r.token_id: (r.logprob, r.rank)}
        for rank, (i, lp) in enumerate(r.top, start=1):
            ranked.setdefault(i, (lp, rank))
        out.append({str(i): {"logprob": lp, "rank": rank, "decoded_token": writer.text(i)}
                    for i, (lp, rank) in ranked.items()})
    return out
