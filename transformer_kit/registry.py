"""The component registry: a pluggy plugin manager plus an index of (kind, name) -> component.

Built-in components are an ordinary plugin (``transformer_kit.plugins``, registered under the
name ``builtin``); third-party plugins are found through the entry-point group
``transformer_kit``. Set ``TRANSFORMER_KIT_DISABLE_PLUGIN_AUTOLOAD=1`` to skip entry points and
``TRANSFORMER_KIT_BLOCK_PLUGINS=name,other`` to block plugins by name (as pytest's ``-p no:``).
"""

from __future__ import annotations

import fnmatch
import importlib
import inspect
import os
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import pluggy

from transformer_kit import hookspecs
from transformer_kit.component import KINDS, Component
from transformer_kit.errors import (
    ComponentError,
    ConfigError,
    PluginError,
    TransformerKitError,
    UnknownComponentError,
    did_you_mean,
)

ENTRY_POINT_GROUP = "transformer_kit"
DISABLE_AUTOLOAD_ENV = "TRANSFORMER_KIT_DISABLE_PLUGIN_AUTOLOAD"
BLOCK_ENV = "TRANSFORMER_KIT_BLOCK_PLUGINS"
#: Plugins that ship with the kit: plugin name -> module path.
BUILTIN_PLUGINS: Mapping[str, str] = {"builtin": "transformer_kit.plugins"}


@dataclass(frozen=True)
class RegisteredComponent:
    """A component together with where it came from."""

    component: Component
    plugin: str
    distribution: str | None


@dataclass(frozen=True)
class PluginFailure:
    """A plugin that could not be loaded; the rest of the kit works without it."""

    plugin: str
    distribution: str | None
    error: str


def _origin(plugin: str, distribution: str | None) -> str:
    """'plugin NAME (distribution DIST)', for messages."""
    return f"plugin {plugin!r}" + (f" (distribution {distribution!r})" if distribution else "")


class Registry:
    """Every registered component, by kind and name."""

    def __init__(self, blocked: Iterable[str] = ()) -> None:
        self.plugin_manager = pluggy.PluginManager(hookspecs.PROJECT)
        self.plugin_manager.add_hookspecs(hookspecs)
        for name in blocked:
            self.plugin_manager.set_blocked(name)
        self._entries: dict[tuple[str, str], RegisteredComponent] = {}
        self._distributions: dict[str, str | None] = {}
        self.failures: list[PluginFailure] = []

    # -- plugins ---------------------------------------------------------------------------
    def register_plugin(
        self, plugin: object, name: str | None = None, *, distribution: str | None = None
    ) -> str | None:
        """Register a plugin (module or object with hook implementations) and index its components.

        Returns the plugin's name, or None when that name is blocked.
        Raises :class:`PluginError` naming the plugin when registration, its hook, or a
        component name conflict fails; the plugin is then left unregistered.
        """
        pm = self.plugin_manager
        name = name or pm.get_canonical_name(plugin)
        if pm.is_blocked(name):
            return None
        origin = _origin(name, distribution)
        try:
            pm.register(plugin, name=name)
        except ValueError as exc:
            raise PluginError(
                f"Cannot register {origin}: {exc}. Plugin names must be unique; pass another "
                "name= or unregister the existing plugin first."
            ) from exc
        except pluggy.PluginValidationError as exc:
            raise PluginError(f"{origin} is not a valid transformer_kit plugin: {exc}") from exc
        try:
            components = self._collect(name, origin)
            self._index(components, name, distribution)
        except BaseException:
            pm.unregister(name=name)
            raise
        self._distributions[name] = distribution
        return name

    def unregister_plugin(self, name: str) -> None:
        """Remove a plugin and every component it contributed."""
        if self.plugin_manager.get_plugin(name) is None:
            raise PluginError(
                f"No plugin named {name!r} is registered; registered: "
                f"{', '.join(self.plugins()) or '(none)'}."
            )
        self.plugin_manager.unregister(name=name)
        self._entries = {k: e for k, e in self._entries.items() if e.plugin != name}
        self._distributions.pop(name, None)

    def plugins(self) -> list[str]:
        """Names of the registered plugins, sorted."""
        return sorted(n for n, p in self.plugin_manager.list_name_plugin() if p is not None)

    def load_entry_points(self, group: str = ENTRY_POINT_GROUP) -> None:
        """Load third-party plugins from an entry-point group; failures are recorded and warned."""
        for ep in metadata.entry_points(group=group):
            dist = ep.dist.name if ep.dist is not None else None
            if self.plugin_manager.is_blocked(ep.name) or self.plugin_manager.has_plugin(ep.name):
                continue
            try:
                plugin = ep.load()
            except Exception as exc:
                self._fail(ep.name, dist, f"import of {ep.value!r} failed: {type(exc).__name__}: {exc}")
                continue
            try:
                self.register_plugin(plugin, name=ep.name, distribution=dist)
            except PluginError as exc:
                self._fail(ep.name, dist, str(exc))

    def _fail(self, plugin: str, dist: str | None, error: str) -> None:
        self.failures.append(PluginFailure(plugin, dist, error))
        warnings.warn(
            f"transformer_kit: {_origin(plugin, dist)} was not loaded: {error}",
            RuntimeWarning,
            stacklevel=3,
        )

    def _collect(self, name: str, origin: str) -> list[Component]:
        impls = [
            impl
            for impl in self.plugin_manager.hook.transformer_kit_components.get_hookimpls()
            if impl.plugin_name == name
        ]
        components: list[Component] = []
        for impl in impls:
            try:
                result = impl.function()
            except Exception as exc:
                raise PluginError(
                    f"{origin} raised in transformer_kit_components: {type(exc).__name__}: {exc}"
                ) from exc
            if result is None:
                continue
            if isinstance(result, Component) or not isinstance(result, Iterable):
                raise PluginError(
                    f"{origin}: transformer_kit_components must return a list of "
                    f"tk.Component, got {type(result).__name__}."
                )
            for item in result:
                if not isinstance(item, Component):
                    raise PluginError(
                        f"{origin}: transformer_kit_components returned a "
                        f"{type(item).__name__}; every item must be a tk.Component."
                    )
                components.append(item)
        return components

    def _index(self, components: list[Component], plugin: str, dist: str | None) -> None:
        new: dict[tuple[str, str], RegisteredComponent] = {}
        for comp in components:
            key = (comp.kind, comp.name)
            other = self._entries.get(key) or new.get(key)
            if other is not None:
                raise PluginError(
                    f"{comp.kind} {comp.name!r} is provided by both "
                    f"{_origin(other.plugin, other.distribution)} and {_origin(plugin, dist)}. "
                    f"Rename one, or block one with {BLOCK_ENV}={plugin}."
                )
            new[key] = RegisteredComponent(comp, plugin, dist)
        self._entries.update(new)

    # -- components ------------------------------------------------------------------------
    def names(self, kind: str, pattern: str | None = None) -> list[str]:
        """Sorted names of the components of ``kind``, optionally filtered by a glob pattern."""
        _check_kind(kind)
        names = sorted(name for k, name in self._entries if k == kind)
        return [n for n in names if fnmatch.fnmatchcase(n, pattern)] if pattern else names

    def entry(self, kind: str, name: str) -> RegisteredComponent:
        """The component with its plugin and distribution; raises UnknownComponentError."""
        _check_kind(kind)
        try:
            return self._entries[(kind, name)]
        except KeyError:
            allowed = self.names(kind)
            raise UnknownComponentError(
                f"Unknown {kind} component {name!r}.{did_you_mean(name, allowed)} "
                f"Registered {kind} components: {', '.join(allowed) or '(none)'}. "
                "Install or register the plugin that provides it."
            ) from None

    def get(self, kind: str, name: str) -> Component:
        """The component registered as ``name`` of ``kind``."""
        return self.entry(kind, name).component

    def entries(self, kind: str | None = None) -> list[RegisteredComponent]:
        """All registered components (of one kind), sorted by kind then name."""
        if kind is not None:
            _check_kind(kind)
        items = sorted(self._entries.items())
        return [e for (k, _), e in items if kind is None or k == kind]

    def create(self, kind: str, name: str, *, context: Mapping[str, Any] | None = None,
               **params: Any) -> Any:
        """Call the factory of ``kind``/``name``.

        ``params`` are the user's parameters and must all be accepted by the factory;
        ``context`` holds the model's sizes (d_model, num_heads, ...) and only those the
        factory names are passed. Invalid parameters raise :class:`ConfigError`; any other
        failure inside the factory raises :class:`ComponentError` naming the plugin.
        """
        entry = self.entry(kind, name)
        comp = entry.component
        label = f"{kind} {name!r} ({_origin(entry.plugin, entry.distribution)})"
        kwargs = _bind(comp, label, dict(context or {}), params)
        try:
            return comp.factory(**kwargs)
        except TransformerKitError:
            raise
        except ValueError as exc:
            raise ConfigError(f"{label}: {exc}") from exc
        except Exception as exc:
            raise ComponentError(
                f"The factory of {label} raised {type(exc).__name__}: {exc}"
            ) from exc


def _bind(comp: Component, label: str, context: dict[str, Any], params: dict[str, Any]) -> dict:
    try:
        signature = inspect.signature(comp.factory)
    except (TypeError, ValueError):  # builtins without a signature: pass the params only
        return params
    accepted = signature.parameters
    open_ended = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values())
    user_params = [n for n in accepted if n not in context]
    for key in params:
        if key in context:
            raise ConfigError(
                f"{label}: parameter {key!r} is set by the model config, not per component; "
                f"set the top-level key {key!r} instead."
            )
        if key not in accepted and not open_ended:
            raise ConfigError(
                f"{label} got unknown parameter {key!r}.{did_you_mean(key, user_params)} "
                f"It accepts: {', '.join(user_params) or '(no parameters)'}."
            )
    kwargs = {k: v for k, v in context.items() if k in accepted}
    kwargs.update(params)
    try:
        signature.bind(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"{label}: {exc}.") from exc
    return kwargs


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ConfigError(
            f"Unknown component kind {kind!r}.{did_you_mean(kind, KINDS)} "
            f"Kinds: {', '.join(KINDS)}."
        )


def _blocked_from_env() -> list[str]:
    return [n.strip() for n in os.environ.get(BLOCK_ENV, "").split(",") if n.strip()]


def _autoload_disabled() -> bool:
    return os.environ.get(DISABLE_AUTOLOAD_ENV, "").strip().lower() not in ("", "0", "false", "no")


def create_default_registry() -> Registry:
    """A registry with the built-in plugins and, unless disabled, the entry-point plugins."""
    registry = Registry(blocked=_blocked_from_env())
    for name, module in BUILTIN_PLUGINS.items():
        if not registry.plugin_manager.is_blocked(name):
            registry.register_plugin(importlib.import_module(module), name=name)
    if not _autoload_disabled():
        registry.load_entry_points()
    return registry


_registry: Registry | None = None


def get_registry() -> Registry:
    """The process-wide registry, created on first use."""
    global _registry
    if _registry is None:
        _registry = create_default_registry()
    return _registry


def reset_registry() -> Registry:
    """Rebuild the process-wide registry (re-reads entry points and environment variables)."""
    global _registry
    _registry = None
    importlib.invalidate_caches()  # see distributions installed since the last look
    return get_registry()


def register_plugin(plugin: object, name: str | None = None) -> str | None:
    """Register a plugin with the process-wide registry; see :meth:`Registry.register_plugin`."""
    return get_registry().register_plugin(plugin, name=name)


def unregister_plugin(name: str) -> None:
    """Remove a plugin from the process-wide registry."""
    get_registry().unregister_plugin(name)
