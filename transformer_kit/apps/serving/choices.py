"""The ``n`` choices of one request, read together: their deltas as they arrive (each tagged
with its choice's index), their whole texts, and the usage of
the lot (the prompt counted once, as OpenAI and vLLM count it)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from transformer_kit.runtime.text_stream import Delta, TextStream, Usage


async def arrivals(streams: list[TextStream]) -> AsyncIterator[tuple[int, list[Delta] | None]]:
    """(index, deltas) as each choice's tokens arrive, and (index, None) once that choice has
    ended; over when every one has. The deltas of one choice come in order."""
    if len(streams) == 1:  # no tasks for the usual request
        async for deltas in streams[0].arrivals():
            yield 0, deltas
        yield 0, None
        return
    arrived: asyncio.Queue[tuple[int, list[Delta] | None]] = asyncio.Queue()

    async def read(index: int, stream: TextStream) -> None:
        try:
            async for deltas in stream.arrivals():
                arrived.put_nowait((index, deltas))
        finally:  # ended (or the reader left): the choice is over
            arrived.put_nowait((index, None))

    readers = [asyncio.ensure_future(read(i, stream)) for i, stream in enumerate(streams)]
    try:
        left = len(streams)
        while left:
            index, deltas = await arrived.get()
            left -= deltas is None
            yield index, deltas
    finally:
        for reader in readers:
            reader.cancel()


async def texts(streams: list[TextStream]) -> list[str]:
    """Every choice's whole text, once all have ended (no thread held)."""
    return list(await asyncio.gather(*(stream.text() for stream in streams)))


def total_usage(streams: list[TextStream]) -> Usage:
    """The usage of every choice together: the prompt's tokens once (and the first choice's
    cached ones), the completion tokens of all."""
    first = streams[0].usage
    return Usage(first.prompt_tokens, sum(stream.usage.completion_tokens for stream in streams),
                 first.cached_tokens)
