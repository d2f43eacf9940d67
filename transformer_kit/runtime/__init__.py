"""The runtime: an export run in onnxruntime, and one engine that batches every kind of request.

    from transformer_kit.runtime import Engine, Service
    engine = Engine("out/")                     # a decoder: continuous batching
    service = Service(engine)                   # the tasks the front-ends call
    stream = service.complete("Once upon a time", max_tokens=16)
    print("".join(delta.text for delta in stream))

``OnnxModel`` runs an export (forward, generate, chat, embed, score); :class:`Engine` batches
the requests of many callers over one (generation, or pooling for embeddings and a
cross-encoder's scores); :class:`Service` is what every front-end (the HTTP server, Ray Serve,
Triton, the command line) calls: text in, text deltas, vectors or scores out, within one set of
:class:`Limits`.
"""

from transformer_kit.export import OnnxModel
from transformer_kit.runtime.engine import Engine, QueueFull
from transformer_kit.runtime.limits import Limits
from transformer_kit.runtime.pooling import Kind, model_kind
from transformer_kit.runtime.requests import GenerationRequest, PoolingRequest, Request
from transformer_kit.runtime.service import Service, prompt_forms
from transformer_kit.runtime.stats import EngineStats

__all__ = ["Engine", "EngineStats", "GenerationRequest", "Kind", "Limits", "OnnxModel",
           "PoolingRequest", "QueueFull", "Request", "Service", "model_kind", "prompt_forms"]
