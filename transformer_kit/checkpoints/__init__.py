"""Hugging Face checkpoints as assembled transformer_kit models (no transformers needed).

    model = tk.from_hf("path/to/gpt2-folder")          # config.json + model.safetensors
    cfg = tk.config_from_hf("path/to/folder")          # the ordinary transformer_kit config

Which ``model_type``s load is up to the plugins: each registers a
:class:`~transformer_kit.CheckpointFamily` (built in: gpt2, bert, llama, marian). The helpers
here (:class:`Weights`, :func:`copy_linear`, ...) are what a family's mapping is written with.
"""

from __future__ import annotations

from transformer_kit.checkpoints.loading import config_from_hf, from_hf
from transformer_kit.checkpoints.mapping import (
    StateDict,
    copy_attention,
    copy_linear,
    first_id,
    put_linear,
    require,
)
from transformer_kit.checkpoints.reader import Weights, read_hf_config, read_hf_weights
from transformer_kit.core.errors import CheckpointError

__all__ = [
    "CheckpointError", "StateDict", "Weights", "config_from_hf", "copy_attention", "copy_linear",
    "first_id", "from_hf", "put_linear", "read_hf_config", "read_hf_weights", "require",
]
