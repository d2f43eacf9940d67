"""The built-in checkpoint families: one module per Hugging Face ``model_type``, each defining
``FAMILY`` (a :class:`transformer_kit.CheckpointFamily`). Every module of this package is found
by name, so adding a family is adding a module (and its test)."""

from __future__ import annotations

import importlib
import pkgutil

from transformer_kit import CheckpointFamily


def builtin_families() -> list[CheckpointFamily]:
    """``FAMILY`` of every module in this package, in module-name order."""
    modules = sorted(info.name for info in pkgutil.iter_modules(__path__) if not info.name.startswith("_"))
    return [importlib.import_module(f"{__name__}.{name}").FAMILY for name in modules]
