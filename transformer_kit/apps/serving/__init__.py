"""Serving an exported decoder: a continuous-batching engine over ``OnnxModel``."""

from transformer_kit.apps.serving.engine import Engine, QueueFull, Request

__all__ = ["Engine", "QueueFull", "Request"]
