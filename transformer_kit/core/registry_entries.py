"""What the registry keeps about each contribution: where it came from (plugin, distribution),
plugins that failed to load, and the indexing that refuses a name two plugins both provide."""

from __future__ import annotations

import contextlib
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from transformer_kit.core.component import CheckpointFamily, Component, Lowering
from transformer_kit.core.errors import PluginError

#: The attribute that holds, on every object a registry's factory made, its
#: :class:`RegisteredComponent` (the export finds each component's lowering by it).
COMPONENT_ATTRIBUTE = "tk_component"


@dataclass(frozen=True)
class RegisteredComponent:
    """A component together with where it came from."""

    component: Component
    plugin: str
    distribution: str | None


@dataclass(frozen=True)
class RegisteredLowering:
    """A lowering together with where it came from."""

    lowering: Lowering
    plugin: str
    distribution: str | None


def mark_component(obj: object, entry: RegisteredComponent) -> None:
    """Record on ``obj`` (what ``entry``'s factory made) the component it is; an object that
    takes no attributes (``__slots__``) stays unmarked, and the export traces it."""
    with contextlib.suppress(AttributeError, TypeError):
        setattr(obj, COMPONENT_ATTRIBUTE, entry)


def component_of(obj: object) -> RegisteredComponent | None:
    """The registered component that made ``obj``, or None (not made by a registry)."""
    entry = getattr(obj, COMPONENT_ATTRIBUTE, None)
    return entry if isinstance(entry, RegisteredComponent) else None


@dataclass(frozen=True)
class RegisteredFamily:
    """A checkpoint family together with where it came from."""

    family: CheckpointFamily
    plugin: str
    distribution: str | None


@dataclass(frozen=True)
class PluginFailure:
    """A plugin that could not be loaded; the rest of the kit works without it."""

    plugin: str
    distribution: str | None
    error: str


def hashable_plugin(plugin: object, project: str) -> object:
    """``plugin``, or for one that cannot be hashed (a ``types.SimpleNamespace``, a dataclass)
    a module holding its hook implementations: pluggy's subset hook callers keep plugins in
    sets, and find hooks with ``inspect.getattr_static``, so a proxy would not do."""
    try:
        hash(plugin)
    except TypeError:
        module = types.ModuleType(getattr(plugin, "__name__", None) or f"plugin_{id(plugin)}")
        for name in dir(plugin):
            if name.startswith(project + "_"):
                setattr(module, name, getattr(plugin, name))
        return module
    return plugin


def origin(plugin: str, distribution: str | None) -> str:
    """'plugin NAME (distribution DIST)', for messages."""
    return f"plugin {plugin!r}" + (f" (distribution {distribution!r})" if distribution else "")


def index_contributions(existing: Mapping, items: list, key: Callable[[Any], Any],
                        label: Callable[[Any], str], wrap: Callable[..., Any], plugin: str,
                        dist: str | None) -> dict:
    """New index entries for ``items``; a key already taken (here or earlier) names both plugins."""
    new: dict = {}
    for item in items:
        k = key(item)
        other = existing.get(k) or new.get(k)
        if other is not None:
            raise PluginError(
                f"{label(item)} is provided by both {origin(other.plugin, other.distribution)} "
                f"and {origin(plugin, dist)}. Rename one, or block one with "
                f"TRANSFORMER_KIT_BLOCK_PLUGINS={plugin}."
            )
        new[k] = wrap(item, plugin, dist)
    return new
