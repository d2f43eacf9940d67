"""Inputs of ``embed`` and ``rerank`` as token ids, the way sentence-transformers makes them:
the prompt put before each text, ``lowercase`` applied, the tokenizer's special tokens added,
each input cut to ``max_seq_length`` tokens (a pair cut longest first)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from transformer_kit.core.decoding.text import Tokenizer
from transformer_kit.core.errors import InputError


@dataclass
class EmbeddingInputs:
    """Per input: its token ids and, for each, 1 when pooled (0: a prompt token left out)."""

    tokens: list[list[int]]
    pooled: list[list[int]]

    @property
    def token_counts(self) -> list[int]:
        """Tokens per input (a request's ``usage.prompt_tokens`` is their sum)."""
        return [len(t) for t in self.tokens]


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def split_inputs(inputs: Any) -> tuple[str, list, bool]:
    """("text", texts, single) or ("ids", id lists, single) from a string, a list of strings,
    a list of ids, a list of id lists, or a (n,) / (batch, n) integer array."""
    if isinstance(inputs, np.ndarray) and inputs.dtype.kind in "iu" and inputs.ndim in (1, 2):
        inputs = inputs.tolist()
    if isinstance(inputs, str):
        return "text", [inputs], True
    if isinstance(inputs, (list, tuple)) and inputs:
        if all(isinstance(x, str) for x in inputs):
            return "text", list(inputs), False
        if all(_is_int(x) for x in inputs):
            return "ids", [[int(x) for x in inputs]], True
        if all(isinstance(x, (list, tuple)) and x and all(_is_int(t) for t in x) for x in inputs):
            return "ids", [[int(t) for t in x] for x in inputs], False
    given = type(inputs).__name__ if not isinstance(inputs, (list, tuple)) else (
        "an empty list" if not inputs else "a list mixing types or holding empty lists")
    raise InputError(f"Inputs must be a string, a list of strings, a list of token ids or a list "
                     f"of non-empty id lists; got {given}.")


class TextEncoder:
    """Token ids for embedding and reranking inputs.

    Args:
        tokenizer: the model's tokenizer (None: only token ids are accepted).
        settings: the model's config as a dict (``max_seq_length``, ``max_len``, ``lowercase``,
            ``sentence_embedding``, ``vocab_size``).
        max_positions: the positional encoding's bound, or None.
    """

    def __init__(self, tokenizer: Tokenizer | None, settings: dict,
                 max_positions: int | None) -> None:
        self.tokenizer = tokenizer
        bounds = [b for b in (settings.get("max_seq_length"), max_positions) if b]
        #: Most tokens of one input (longer ones are cut).
        self.max_tokens: int = min(bounds) if bounds else int(settings["max_len"])
        self.lowercase = bool(settings.get("lowercase"))
        self.vocab = int(settings["vocab_size"])
        self.sentence: dict = settings.get("sentence_embedding") or {}
        self._cutting = None
        self._lock = threading.Lock()
        self._prompt_lengths: dict[str, int] = {}

    def __getstate__(self) -> dict:
        """Copied or pickled without its lock and truncating tokenizer (made again on use)."""
        return {**self.__dict__, "_lock": None, "_cutting": None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def _backend(self):
        """The tokenizer with truncation at :attr:`max_tokens` (a copy: the model's is shared)."""
        if self.tokenizer is None:
            raise InputError("This model was exported without a tokenizer, so it takes token ids, "
                             "not text; pass lists of ids, or export it from a folder with a "
                             "tokenizer.json.")
        with self._lock:
            if self._cutting is None:
                from tokenizers import Tokenizer

                backend = Tokenizer.from_str(self.tokenizer.backend.to_str())
                backend.no_padding()
                backend.enable_truncation(self.max_tokens, strategy="longest_first")
                self._cutting = backend
        return self._cutting

    def prompt(self, prompt_name: str | None = None, prompt: str | None = None) -> str | None:
        """The prompt text: ``prompt``, else the named one, else the model's default."""
        prompts = self.sentence.get("prompts") or {}
        if prompt is not None and prompt_name is not None:
            raise InputError("Give prompt or prompt_name, not both.")
        if prompt is not None:
            if not isinstance(prompt, str):
                raise InputError(f"prompt must be a string, got {type(prompt).__name__}.")
            return prompt
        name = prompt_name if prompt_name is not None else self.sentence.get("default_prompt_name")
        if name is None:
            return None
        if name not in prompts:
            raise InputError(f"prompt_name {name!r} is not one of this model's prompts "
                             f"({', '.join(map(repr, prompts)) or 'none'}); pass one of them, or "
                             "prompt='...' for your own.")
        return prompts[name]

    def _prompt_length(self, prompt: str) -> int:
        """Tokens the prompt takes at the start of an input (its trailing special token, as
        [SEP], not counted), as sentence-transformers measures it."""
        if prompt not in self._prompt_lengths:
            backend = self._backend()
            ids = backend.encode(prompt.lower() if self.lowercase else prompt).ids
            special = {i for i, t in backend.get_added_tokens_decoder().items() if t.special}
            self._prompt_lengths[prompt] = len(ids) - (1 if ids and ids[-1] in special else 0)
        return self._prompt_lengths[prompt]

    def encode(self, inputs: Any, *, prompt_name: str | None = None,
               prompt: str | None = None) -> tuple[EmbeddingInputs, bool]:
        """Inputs -> their ids and pooled positions, and whether one input was given."""
        kind, items, single = split_inputs(inputs)
        if kind == "ids":
            if prompt is not None or prompt_name is not None:
                raise InputError("A prompt applies to texts; these inputs are token ids. Put the "
                                 "prompt's ids before them yourself, or pass texts.")
            for row, ids in enumerate(items):
                bad = [t for t in ids if not 0 <= t < self.vocab]
                if bad:
                    raise InputError(f"Input {row} holds token id {bad[0]}, outside the vocabulary "
                                     f"(0..{self.vocab - 1}); token ids are this model's tokenizer's: "
                                     "give the text instead (ids of another tokenizer, such as "
                                     "tiktoken's, mean other tokens here).")
            tokens = [ids[:self.max_tokens] for ids in items]
            return EmbeddingInputs(tokens, [[1] * len(t) for t in tokens]), single
        text = self.prompt(prompt_name, prompt)
        texts = [(text or "") + t for t in items]
        texts = [t.lower() for t in texts] if self.lowercase else texts
        tokens = [e.ids for e in self._backend().encode_batch(texts)]
        empty = [i for i, ids in enumerate(tokens) if not ids]
        if empty:
            raise InputError(f"Inputs {empty} encode to no token; give some text.")
        skip = 0
        if text and not self.sentence.get("include_prompt", True):
            skip = self._prompt_length(text)
        pooled = [[0 if j < skip else 1 for j in range(len(ids))] for ids in tokens]
        return EmbeddingInputs(tokens, pooled), single

    def encode_pairs(self, query: str, documents: Sequence[str]) -> tuple[list[list[int]], list[list[int]]]:
        """(query, document) pairs -> their ids and token types (0: the query's, 1: the
        document's), cut longest first."""
        if not isinstance(query, str):
            raise InputError(f"query must be a string, got {type(query).__name__}.")
        if isinstance(documents, str) or not isinstance(documents, (list, tuple)) or not all(
                isinstance(d, str) for d in documents):
            raise InputError("documents must be a list of strings.")
        case = (lambda t: t.lower()) if self.lowercase else (lambda t: t)
        encodings = self._backend().encode_batch([(case(query), case(d)) for d in documents])
        return [e.ids for e in encodings], [e.type_ids for e in encodings]
