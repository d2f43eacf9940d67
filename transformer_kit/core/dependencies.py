"""Imports of the parts that need torch, refused with a sentence where it is not installed (the
base install runs and serves exports; ``pip install 'transformer-kit[torch]'`` builds, imports
and exports models)."""

from __future__ import annotations

import importlib
from typing import Any

from transformer_kit.core.errors import DependencyError

TORCH_INSTALL = "pip install 'transformer-kit[torch]'"
#: The packages of the ``torch`` extra (pyproject.toml), by import name.
TORCH_EXTRA = frozenset({"torch", "onnx_ir", "onnxscript", "matplotlib"})


def needing_torch(module: str, name: str) -> Any:
    """``module.name``, imported now; a :class:`DependencyError` naming ``name`` where a package
    of the ``torch`` extra is not installed."""
    try:
        return getattr(importlib.import_module(module), name)
    except ModuleNotFoundError as exc:
        if exc.name not in TORCH_EXTRA:
            raise
        raise DependencyError(f"{name} needs the torch extra ({exc.name} is not installed): {TORCH_INSTALL}. "
                              "Running and serving an export does not (transformer_kit.runtime.OnnxModel, "
                              "transformer-kit serve).") from None
