"""ONNX translations of custom torch ops, gathered from the plugins'
``transformer_kit_onnx_translations`` hooks."""

from __future__ import annotations

from typing import Any

from transformer_kit.core.errors import ExportError
from transformer_kit.core.registry import get_registry

TRANSLATIONS_HOOK = "transformer_kit_onnx_translations"


def _plugins_translating(op: Any = None) -> list[str]:
    """Plugins whose translations hook maps ``op``, or (op None) raises; asked one at a time."""
    registry, found = get_registry(), []
    for name in registry.plugins():
        try:
            tables = registry.plugin_hook(name, TRANSLATIONS_HOOK)()
        except Exception:
            found += [name] if op is None else []
            continue
        found += [name] if op is not None and any(op in dict(t or {}) for t in tables) else []
    return found


def collect_translations() -> dict:
    """ONNX translations for custom torch ops: every plugin's ``transformer_kit_onnx_translations``
    hook, called through pluggy. A hook that raises, or an op translated twice, names the
    plugins."""
    try:
        results = get_registry().plugin_manager.hook.transformer_kit_onnx_translations()
        tables = [dict(t) for t in results if t]
    except Exception as exc:
        culprit = ", ".join(repr(n) for n in _plugins_translating()) or "a plugin"
        raise ExportError(f"plugin {culprit} raised in {TRANSLATIONS_HOOK}: "
                          f"{type(exc).__name__}: {exc}") from exc
    table: dict = {}
    for result in tables:
        for op, translation in result.items():
            if op in table:
                first, second = [*_plugins_translating(op), "?", "?"][:2]
                raise ExportError(f"Both plugin {first!r} and plugin {second!r} translate {op}; "
                                  "block one of them.")
            table[op] = translation
    return table
