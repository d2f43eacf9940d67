"""Serving an export: a continuous-batching engine over a decoder's ``OnnxModel``, and an
embedding engine batching embeddings and rerank requests across clients."""

from transformer_kit.apps.serving.embedding_engine import EmbeddingEngine
from transformer_kit.apps.serving.engine import Engine, QueueFull
from transformer_kit.apps.serving.requests import Request

__all__ = ["EmbeddingEngine", "Engine", "QueueFull", "Request"]
