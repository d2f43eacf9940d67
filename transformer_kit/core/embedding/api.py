"""``embed``, ``score`` and ``rerank``: one implementation for the PyTorch model and
``OnnxModel``, which each hold a :class:`SentenceTasks` over themselves and only run a padded
batch (a :class:`SentenceRunner`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from transformer_kit.core.embedding.batches import plan_batches
from transformer_kit.core.embedding.inputs import EmbeddingInputs, TextEncoder
from transformer_kit.core.errors import InputError

#: Padded tokens per run by default (rows x the longest row): 32 rows of 256 tokens.
DEFAULT_BATCH_TOKENS = 8192


@dataclass(frozen=True)
class RerankResult:
    """One document of a ranking: its index in the request, its relevance score, and the
    document when asked for."""

    index: int
    score: float
    document: str | None = None


def _l2_normalize(x: np.ndarray) -> np.ndarray:
    """Rows divided by max(their L2 norm, 1e-12) (torch's F.normalize)."""
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    return (x / np.maximum(norms, 1e-12)).astype(np.float32)


class SentenceRunner(Protocol):
    """What a runtime gives :class:`SentenceTasks`: its tokenizer, its settings and the runs of
    one padded batch (public: the server's engine runs the batches it gathers through them)."""

    tokenizer: Any

    def embedding_settings(self) -> tuple[dict, int | None]:
        """The model config as a dict, and the positional encoding's bound (or None)."""

    def run_embedding(self, ids: np.ndarray, real: np.ndarray, pooled: np.ndarray) -> np.ndarray:
        """ids, real, pooled (batch, len) -> sentence embeddings (batch, dim) float32."""

    def run_scores(self, ids: np.ndarray, real: np.ndarray, types: np.ndarray) -> np.ndarray:
        """ids, real, token types (batch, len) -> scores (batch, num_labels) float32."""


class SentenceTasks:
    """Sentence embeddings and cross-encoder scores over a runtime's padded batches: texts (or
    token ids) in, prompts and truncation as sentence-transformers applies them, batches by
    token budget, vectors and scores out. ``model.embed``/``encode``, ``score`` and ``rerank``
    of the PyTorch encoder and of ``OnnxModel`` are this object's.

    Args:
        runner: the runtime (the model itself).
    """

    def __init__(self, runner: SentenceRunner) -> None:
        self.runner = runner
        self._text_encoder: TextEncoder | None = None

    @property
    def text_encoder(self) -> TextEncoder:
        """Turns texts into the token ids ``embed`` and ``rerank`` run (prompts, truncation)."""
        if self._text_encoder is None:
            settings, bound = self.runner.embedding_settings()
            self._text_encoder = TextEncoder(self.runner.tokenizer, settings, bound)
        return self._text_encoder

    def _require(self, key: str, what: str, fix: str) -> dict:
        settings, _ = self.runner.embedding_settings()
        if settings.get(key) is None:
            raise InputError(f"This model has no {what} (its config has no {key!r}); {fix}")
        return settings

    def encode_inputs(self, inputs: Any, *, prompt_name: str | None = None,
                      prompt: str | None = None) -> EmbeddingInputs:
        """The token ids :meth:`encode` would run for ``inputs`` (their counts are the usage)."""
        return self.text_encoder.encode(inputs, prompt_name=prompt_name, prompt=prompt)[0]

    def encode(self, inputs: Any, *, normalize: bool | None = None, prompt_name: str | None = None,
              prompt: str | None = None, dimensions: int | None = None, batch_size: int = 32,
              max_batch_tokens: int | None = DEFAULT_BATCH_TOKENS) -> np.ndarray:
        """Sentence embeddings (n, dim) float32, as sentence-transformers' ``encode`` gives them.

        Args:
            inputs: a string, a list of strings, or token ids (a list, or a list of lists).
            normalize: True L2-normalises the vectors; None or False leaves them as the model
                makes them (a model with a ``Normalize`` module always normalises).
            prompt_name: one of the model's prompts, put before each text (``query``); the
                model's ``default_prompt_name`` when none is given. ``prompt``: your own text.
            dimensions: keep the first ``dimensions`` features (Matryoshka models), normalised
                again when the vectors are normalised.
            batch_size, max_batch_tokens: most rows, and most padded tokens, per run; inputs
                run sorted by length so that little is padding.
        """
        settings = self._require("pooling", "sentence embedding",
                                 "load a sentence-transformers folder, or use rerank for a "
                                 "cross-encoder.")
        encoded, _ = self.text_encoder.encode(inputs, prompt_name=prompt_name, prompt=prompt)
        vectors: np.ndarray | None = None
        for batch in plan_batches(encoded.tokens, encoded.pooled, batch_size=batch_size,
                                  max_batch_tokens=max_batch_tokens, pad_id=settings.get("pad_id") or 0):
            out = np.asarray(self.runner.run_embedding(batch.ids, batch.real, batch.extra), np.float32)
            if vectors is None:
                vectors = np.empty((len(encoded.tokens), out.shape[1]), np.float32)
            vectors[batch.rows] = out
        assert vectors is not None  # encode refuses empty inputs
        normalized = bool(normalize) or bool((settings.get("sentence_embedding") or {}).get("normalize"))
        if dimensions is not None:
            if isinstance(dimensions, bool) or not isinstance(dimensions, int) or not (
                    1 <= dimensions <= vectors.shape[1]):
                raise InputError(f"dimensions must be an integer from 1 to {vectors.shape[1]} (this "
                                 f"model's embedding size), got {dimensions!r}.")
            vectors = np.ascontiguousarray(vectors[:, :dimensions])
        return _l2_normalize(vectors) if normalized and (normalize or dimensions) else vectors

    def score(self, query: str, documents: Sequence[str], *, batch_size: int = 32,
              max_batch_tokens: int | None = DEFAULT_BATCH_TOKENS) -> np.ndarray:
        """A cross-encoder's scores of (query, document) pairs, as sentence-transformers'
        ``CrossEncoder.predict``: (n,) float32 for one label, (n, num_labels) for more."""
        settings = self._require("classifier", "classifier",
                                 "load a cross-encoder (a *ForSequenceClassification checkpoint).")
        tokens, types = self.text_encoder.encode_pairs(query, documents)
        if not tokens:
            return np.zeros((0,) if settings["classifier"]["num_labels"] == 1 else
                            (0, settings["classifier"]["num_labels"]), np.float32)
        scores = np.empty((len(tokens), settings["classifier"]["num_labels"]), np.float32)
        for batch in plan_batches(tokens, types, batch_size=batch_size,
                                  max_batch_tokens=max_batch_tokens, pad_id=settings.get("pad_id") or 0):
            scores[batch.rows] = self.runner.run_scores(batch.ids, batch.real, batch.extra)
        return scores[:, 0] if scores.shape[1] == 1 else scores

    def rerank(self, query: str, documents: Sequence[str], *, top_n: int | None = None,
               return_documents: bool = False, batch_size: int = 32,
               max_batch_tokens: int | None = DEFAULT_BATCH_TOKENS) -> list[RerankResult]:
        """The documents by relevance to ``query``, best first (``top_n`` of them): each its
        index in ``documents`` and its score (a one-label cross-encoder's)."""
        settings = self._require("classifier", "classifier",
                                 "load a cross-encoder (a *ForSequenceClassification checkpoint).")
        if settings["classifier"]["num_labels"] != 1:
            raise InputError(f"rerank ranks by one relevance score, but this classifier has "
                             f"{settings['classifier']['num_labels']} labels; use score() for "
                             "every label's.")
        if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1):
            raise InputError(f"top_n must be a positive integer or None, got {top_n!r}.")
        scores = self.score(query, documents, batch_size=batch_size,
                            max_batch_tokens=max_batch_tokens)
        order = sorted(range(len(scores)), key=lambda i: (-float(scores[i]), i))[:top_n]
        return [RerankResult(i, float(scores[i]), documents[i] if return_documents else None)
                for i in order]
