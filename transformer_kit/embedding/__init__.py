"""Sentence embeddings and reranking for both runtimes: texts (or token ids) in, prompts and
truncation as sentence-transformers applies them, batches by token budget, vectors and scores
out. :class:`Embeds` gives ``embed``, ``score`` and ``rerank`` to the PyTorch model and to
``OnnxModel`` alike."""

from transformer_kit.embedding.api import Embeds, RerankResult
from transformer_kit.embedding.batches import Batch, plan_batches
from transformer_kit.embedding.inputs import EmbeddingInputs, TextEncoder

__all__ = ["Batch", "EmbeddingInputs", "Embeds", "RerankResult", "TextEncoder", "plan_batches"]
