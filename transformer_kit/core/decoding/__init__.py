"""Decoding, once for every runtime: options, logits processors and the search strategies.

Everything here works on numpy next-token logits, so PyTorch models and onnxruntime graphs
share one implementation of greedy search, sampling and beam search (see :mod:`.search`).
"""

from transformer_kit.core.decoding.options import GenerationConfig, generation_config
from transformer_kit.core.decoding.processors import (
    KIND,
    DecodingState,
    LogitsProcessor,
    Pipeline,
    build_pipeline,
)
from transformer_kit.core.decoding.search import DecodingCall, Stepper, generate_tokens, stream_tokens
from transformer_kit.core.decoding.sequence import SequenceSearch

__all__ = [
    "KIND",
    "DecodingCall",
    "DecodingState",
    "GenerationConfig",
    "LogitsProcessor",
    "Pipeline",
    "SequenceSearch",
    "Stepper",
    "build_pipeline",
    "generate_tokens",
    "generation_config",
    "stream_tokens",
]
