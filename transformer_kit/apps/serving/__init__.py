"""Serving an exported decoder: a continuous-batching engine over ``OnnxModel``."""

from transformer_kit.apps.serving.engine import Engine, QueueFull
from transformer_kit.apps.serving.requests import Request

__all__ = ["Engine", "QueueFull", "Request"]
