"""One generation run directly on an ``OnnxModel`` and read back as text, with the count of
tokens it generated: what the command line's ``generate`` prints.

Prompts are text (encoded with the export's tokenizer, its stop strings matched while decoding)
or token ids. The rows come back whole (a batch, beam search, several sequences per prompt), or
one row streams as its tokens are chosen. Nothing is shared with other callers' requests: that
is the :class:`~.engine.Engine`'s work, and :class:`~.service.Service`'s text over it.

    run = OneShotGeneration(model, ["Once upon a time"], max_new_tokens=16)
    stream = run.stream()
    print("".join(delta.text for delta in stream) + stream.rest(), len(stream.tokens))
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from transformer_kit.core.decoding.defaults import call_config
from transformer_kit.core.decoding.text import TextPieces, require, row_texts
from transformer_kit.core.errors import InputError
from transformer_kit.runtime.onnx_model import OnnxModel
from transformer_kit.runtime.text_stream import Delta
from transformer_kit.tokenizer import TextTokenizer


@dataclass(frozen=True)
class GeneratedRows:
    """The rows of a generation run whole.

    Attributes:
        tokens: (batch x num_return_sequences, steps) int64 new tokens, as
            ``OnnxModel.generate`` gives them (a row that ended holds pad_id or its eos id after).
        texts: each row's text (up to its first eos id, cut before a stop string), or None
            when the prompts were token ids.
        eos_ids: the ids that end a row.
    """

    tokens: np.ndarray
    texts: list[str] | None
    eos_ids: list[int]

    @property
    def token_count(self) -> int:
        """Tokens generated: each row's up to its first eos id (included), else all of it."""
        ends = [np.flatnonzero(np.isin(row, self.eos_ids)) for row in self.tokens]
        return sum(int(e[0]) + 1 if len(e) else len(row) for e, row in zip(ends, self.tokens, strict=True))


class RowStream:
    """One row's tokens as they are chosen: iterate it for a :class:`~.text_stream.Delta` per
    token (its text '' when the prompt was token ids, while a character is incomplete, or
    while the text may be a stop string's start), then take :meth:`rest`. ``tokens``: the
    tokens so far (the eos id or the stop string's last token included)."""

    def __init__(self, steps: Iterator[np.ndarray], pieces: TextPieces | None) -> None:
        self.steps, self.pieces = steps, pieces
        self.tokens: list[int] = []

    def __iter__(self) -> Iterator[Delta]:
        for step in self.steps:  # (1,) the row's token
            token = int(step[0])
            self.tokens.append(token)
            yield Delta(self.pieces.add(token) if self.pieces is not None else "", token)

    def rest(self) -> str:
        """The text left at the end (held back for a stop string, an incomplete character)."""
        pieces = self.pieces
        return "" if pieces is None or pieces.ended else pieces.finish()


class OneShotGeneration:
    """A generation of ``prompts`` on ``model``: :meth:`generate` for every row whole,
    :meth:`stream` for a single row as it is chosen (:attr:`streams` says which fits).

    Args:
        model: an export of a decoder (or an encoder-decoder, from source ids).
        prompts: texts (a batch, encoded with the export's tokenizer and its special tokens),
            or (batch, len) int64 token ids.
        attention_mask: (batch, len) 1 for real ids, 0 for padding (ids only; None: padding
            from the model's pad_id).
        options: generation options, as ``OnnxModel.generate`` takes them.

    Raises InputError for a bad option, or text prompts to an export without a tokenizer.
    """

    def __init__(self, model: OnnxModel, prompts: list[str] | np.ndarray, *,
                 attention_mask: np.ndarray | None = None, **options: Any) -> None:
        config = call_config(model.generation_defaults, None, options)
        self.model, self.options = model, options
        self.eos_ids = config.eos_ids(model.manifest.eos_id)
        self.stops = config.stop
        self.tokenizer: TextTokenizer | None = None
        self.stop_matcher: Callable[[np.ndarray], np.ndarray] | None = None
        if isinstance(prompts, list):
            self.tokenizer = require(model.tokenizer, str(model.path))
            prompts, attention_mask = self.tokenizer.encode(prompts)
            self.stop_matcher = self.tokenizer.stop_matcher(self.stops) if self.stops else None
        self.ids, self.attention_mask = prompts, attention_mask
        #: Rows generated: batch x num_return_sequences.
        self.rows = len(prompts) * config.num_return_sequences
        #: Whether the generation is one row chosen token by token (no beam search).
        self.streams = self.rows == 1 and config.num_beams == 1

    @property
    def is_text(self) -> bool:
        """Whether the prompts were text (so the rows are read back as text)."""
        return self.tokenizer is not None

    def generate(self) -> GeneratedRows:
        """Every row, once generation ended."""
        tokens = self.model.generate(self.ids, attention_mask=self.attention_mask,
                                     stop_matcher=self.stop_matcher, **self.options)
        texts = row_texts(self.tokenizer, tokens, self.eos_ids, self.stops) if self.is_text else None
        return GeneratedRows(tokens, texts, self.eos_ids)

    def stream(self) -> RowStream:
        """The single row as its tokens are chosen; InputError for several rows (call
        :meth:`generate`) or beam search (it chooses the tokens only at the end)."""
        if self.rows != 1:
            raise InputError(f"stream reads one row as it is chosen, and this generation has "
                             f"{self.rows} (prompts x num_return_sequences); call generate.")
        steps = self.model.stream(self.ids, attention_mask=self.attention_mask,
                                  stop_matcher=self.stop_matcher, **self.options)
        pieces = TextPieces(self.tokenizer, self.eos_ids, self.stops) if self.is_text else None
        return RowStream(steps, pieces)
