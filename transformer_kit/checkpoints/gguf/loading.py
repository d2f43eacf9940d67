"""``from_gguf``: a GGUF file (llama.cpp, Ollama), local or one file of a Hub repository, as an
assembled model, through the same checkpoint family ``from_hf`` uses for its architecture."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from transformer_kit.checkpoints.gguf.config import hf_config
from transformer_kit.checkpoints.gguf.file import open_gguf, read_metadata
from transformer_kit.checkpoints.gguf.tensors import GgufTensors, kit_blocks
from transformer_kit.checkpoints.gguf.tokenizer import gguf_tokenizer
from transformer_kit.checkpoints.hub import gguf_path
from transformer_kit.checkpoints.loading import (
    _dtype,
    assemble,
    checkpoint_family,
    family_state,
    kit_config,
)
from transformer_kit.core.config import ModelConfig
from transformer_kit.core.errors import CheckpointError
from transformer_kit.core.model import TransformerModel
from transformer_kit.tokenizer import TextTokenizer


class _Opened:
    """An opened GGUF file: its config dict, tensors, family and tokenizer."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self.reader = open_gguf(path)
        meta = read_metadata(self.reader)
        shapes = {t.name: tuple(int(d) for d in reversed(t.shape.tolist())) for t in self.reader.tensors}
        freqs = [np.asarray(t.data, np.float32) for t in self.reader.tensors if t.name == "rope_freqs.weight"]
        try:
            self.hf = hf_config(meta, shapes, freqs[0] if freqs else None)
        except CheckpointError as exc:
            raise CheckpointError(f"{self.path!r}: {exc}") from None
        self.family = checkpoint_family(self.hf, path).family
        self.tensors = GgufTensors(self.reader, meta["general.architecture"], self.hf)
        self.tokenizer: TextTokenizer | None = gguf_tokenizer(self.reader, self.path,
                                                              meta["general.architecture"])

    def config(self, overrides: dict[str, Any]) -> ModelConfig:
        return kit_config(self.hf, self.family, self.path, overrides, self.tokenizer)


def config_from_gguf(path: str | Path, *, gguf_file: str | None = None, revision: str | None = None,
                     **overrides: Any) -> ModelConfig:
    """The transformer_kit config of the model in GGUF file ``path`` (a local file or a Hub
    name, with ``gguf_file`` and ``revision`` as in :func:`from_gguf`; ``overrides`` replace
    keys, as in :func:`~transformer_kit.config_from_hf`)."""
    return _Opened(gguf_path(path, gguf_file=gguf_file, revision=revision)).config(overrides)


def from_gguf(path: str | Path, *, gguf_file: str | None = None, revision: str | None = None,
              dtype: str | torch.dtype = "float32", stream: bool = False,
              **overrides: Any) -> TransformerModel:
    """Load a GGUF file (llama.cpp's format) as an assembled transformer_kit model.

    The file's metadata becomes the Hugging Face config.json of its architecture
    (``general.architecture``: llama (SmolLM2, most Mistral files; Mixtral when
    ``llama.expert_count`` > 0), qwen2, qwen3, gemma, olmo2, gemma2, gemma3, phi3, granite,
    smollm3, and the mixtures of experts qwen3moe, qwen2moe, olmoe, granitemoe, gpt-oss), which the
    checkpoint family ``from_hf`` uses maps, with the file's tensors dequantized to float32 (one
    at a time) under their Hugging Face names. The model equals transformers' own loading of the
    file (``from_pretrained(folder, gguf_file=...)``).

    Besides ``model.tokenizer`` (rebuilt from ``tokenizer.ggml.*``, with the chat template), the
    model keeps ``model.gguf_blocks``: for every weight matrix stored quantized, its
    :class:`~transformer_kit.checkpoints.gguf.blocks.GgufBlocks` (the file's own blocks), by
    parameter name; a mixture of experts' stacked experts (``ffn_gate_exps`` (experts, d_ff,
    d_model), ...) are read one expert at a time and give one entry per expert
    (``decoder.layers.N.feedforward.experts.E.gate.weight``).

    Args:
        path: the ``.gguf`` file; or a file of a Hub repository, ``"org/name:FILE.gguf"``
            (or ``"org/name"`` with ``gguf_file``), which ``huggingface_hub`` downloads alone
            into its cache (``HF_HOME`` / ``HF_HUB_CACHE``; ``HF_HUB_OFFLINE=1``: the cache
            only); a local path of the same name wins.
        gguf_file: the file's name in the Hub repository (or local folder) ``path``.
        revision: a Hub repository's branch, tag or commit (its default branch when None).
        dtype: the parameters' dtype: ``"float32"`` (the default), ``"bfloat16"`` or
            ``"float16"``.
        stream: keep the weights in the file: the model's parameters are on the ``meta``
            device and ``export_onnx`` reads (and dequantizes) each tensor as it writes it, or
            writes its blocks, so a model whose float32 weights are larger than memory exports
            (a 30B mixture of experts in 4-bit blocks). Such a model does not run in PyTorch.
        overrides: config keys to replace (``attention="matmul"``, ``eos_id=...``).

    Raises:
        CheckpointError: a missing, truncated or non-GGUF file, an architecture or tensor type
            the kit does not read, or one whose family is not registered; a Hub name that is not
            in the cache offline, or whose repository, revision or file does not exist.
    """
    opened = _Opened(gguf_path(path, gguf_file=gguf_file, revision=revision))
    config = opened.config(overrides)
    dtype = _dtype(dtype, {"torch_dtype": "float32"})
    state = family_state(opened.hf, opened.family, opened.tensors.deferred(), opened.path, config)
    blocks = kit_blocks(state, opened.tensors)
    model = assemble(config, state, opened.path, dtype, opened.tokenizer, stream)
    model.gguf_blocks = blocks
    return model
