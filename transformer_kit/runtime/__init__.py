"""The runtime: export folders run with numpy and onnxruntime (never torch), and one engine that
batches every kind of request.

    from transformer_kit.runtime import Engine, OnnxModel, Service
    om = OnnxModel("out/")                      # an export folder (its manifest says what it is)
    om.generate(ids, max_new_tokens=16)
    engine = Engine("out/")                     # a decoder: continuous batching
    service = Service(engine)                   # the tasks the front-ends call
    stream = service.complete("Once upon a time", max_tokens=16)
    print("".join(delta.text for delta in stream))

``OnnxModel`` runs an export (forward, generate, chat, embed, score); :class:`Engine` batches
the requests of many callers over one (generation, or pooling for embeddings and a
cross-encoder's scores); :class:`Service` is what every server (the HTTP server, Ray Serve,
Triton) calls: text in, text deltas, vectors or scores out, within one set of :class:`Limits`.
The command line's ``generate`` and ``chat`` run once on the ``OnnxModel``, no engine between:
:class:`OneShotGeneration` (rows whole, or one streamed, with their token count) and
:class:`ChatSession` (a conversation turn after turn).
"""

from transformer_kit.runtime.chat_session import ChatSession
from transformer_kit.runtime.engine import Engine, QueueFull
from transformer_kit.runtime.limits import Limits
from transformer_kit.runtime.manifest import Manifest
from transformer_kit.runtime.one_shot import GeneratedRows, OneShotGeneration, RowStream
from transformer_kit.runtime.onnx_model import OnnxModel
from transformer_kit.runtime.pooling import Kind, model_kind
from transformer_kit.runtime.request_options import RequestOptions
from transformer_kit.runtime.requests import GenerationRequest, PoolingRequest, Request
from transformer_kit.runtime.service import Service, prompt_forms
from transformer_kit.runtime.stats import EngineStats

__all__ = ["ChatSession", "Engine", "EngineStats", "GeneratedRows", "GenerationRequest", "Kind",
           "Limits", "Manifest", "OneShotGeneration", "OnnxModel", "PoolingRequest", "QueueFull", "Request",
           "RequestOptions",
           "RowStream", "Service", "model_kind", "prompt_forms"]
