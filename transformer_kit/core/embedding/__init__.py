"""Sentence embeddings and reranking for both runtimes: texts (or token ids) in, prompts and
truncation as sentence-transformers applies them, batches by token budget, vectors and scores
out. Each model holds a :class:`SentenceTasks` over itself (its ``embed``, ``score`` and
``rerank`` are that object's) and runs the padded batches (:class:`SentenceRunner`)."""

from transformer_kit.core.embedding.api import RerankResult, SentenceRunner, SentenceTasks
from transformer_kit.core.embedding.batches import Batch, plan_batches
from transformer_kit.core.embedding.inputs import EmbeddingInputs, TextEncoder

__all__ = ["Batch", "EmbeddingInputs", "RerankResult", "SentenceRunner", "SentenceTasks", "TextEncoder",
           "plan_batches"]
