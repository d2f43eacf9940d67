"""Hugging Face checkpoints as assembled transformer_kit models (no transformers needed).

    model = tk.from_hf("path/to/gpt2-folder")          # config.json + model.safetensors
    cfg = tk.config_from_hf("path/to/folder")          # the ordinary transformer_kit config

Which ``model_type``s load is up to the plugins: each registers a
:class:`~transformer_kit.CheckpointFamily` (built in: gpt2, bert, llama, marian). The helpers
here (:class:`Weights`, :func:`copy_linear`, ...) are what a family's mapping is written with.
"""

from __future__ import annotations

import importlib
from typing import Any

from transformer_kit.core.errors import CheckpointError

#: Each public name and the module it lives in, imported when first read: reading checkpoints
#: needs torch, naming one (``checkpoints.hub``, a served export's source) does not.
_NAMES = {"config_from_hf": "loading", "from_hf": "loading", "StateDict": "mapping",
          "copy_attention": "mapping", "copy_linear": "mapping", "first_id": "mapping",
          "put_linear": "mapping", "require": "mapping", "Weights": "reader",
          "read_hf_config": "reader", "read_hf_weights": "reader"}

__all__ = ["CheckpointError", *sorted(_NAMES)]


def __getattr__(name: str) -> Any:
    if name not in _NAMES:
        raise AttributeError(f"module 'transformer_kit.checkpoints' has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_NAMES[name]}"), name)
