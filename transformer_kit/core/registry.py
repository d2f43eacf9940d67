"""The registry: a pluggy plugin manager plus an index of what the plugins contribute.

Components and their lowerings are indexed by (kind, name), checkpoint families by ``model_type``. A plugin's
contributions are read when it is registered, by calling its hooks through pluggy (a subset
hook caller holding just that plugin, so each contribution's plugin is known and a conflict
names both). Built-ins are ordinary plugins (loaded by name from a table, as pytest loads its
default plugins; each imported when one of its kinds is first asked for, so that decoding with a
logits processor imports no torch); third-party plugins come from the entry-point group
``transformer_kit``. ``TRANSFORMER_KIT_DISABLE_PLUGIN_AUTOLOAD=1`` skips entry points and
``TRANSFORMER_KIT_BLOCK_PLUGINS=name,other`` blocks plugins by name (as pytest's ``-p no:``).
"""

from __future__ import annotations

import fnmatch
import importlib
import os
import threading
import warnings
from collections.abc import Iterable, Mapping
from importlib import metadata
from typing import Any

import pluggy

from transformer_kit.core import hookspecs
from transformer_kit.core.component import KINDS, MODEL_KINDS, CheckpointFamily, Component, Lowering
from transformer_kit.core.dependencies import TORCH_EXTRA, TORCH_INSTALL
from transformer_kit.core.errors import (
    CheckpointError,
    ComponentError,
    ConfigError,
    PluginError,
    TransformerKitError,
    UnknownComponentError,
    did_you_mean,
)
from transformer_kit.core.factory_arguments import bind_factory_arguments
from transformer_kit.core.registry_entries import (
    PluginFailure,
    RegisteredComponent,
    RegisteredFamily,
    RegisteredLowering,
    hashable_plugin,
    index_contributions,
    mark_component,
    origin,
)

ENTRY_POINT_GROUP = "transformer_kit"
DISABLE_AUTOLOAD_ENV = "TRANSFORMER_KIT_DISABLE_PLUGIN_AUTOLOAD"
BLOCK_ENV = "TRANSFORMER_KIT_BLOCK_PLUGINS"
#: Plugins that ship with the kit: plugin name -> (module path, the component kinds it contributes).
BUILTIN_PLUGINS: Mapping[str, tuple[str, tuple[str, ...]]] = {
    "builtin": ("transformer_kit.plugins.builtin", MODEL_KINDS),
    "builtin.decoding": ("transformer_kit.plugins.decoding", ("logits_processor",)),
}


class Registry:
    """Every registered component, by kind and name, and every checkpoint family."""

    def __init__(self, blocked: Iterable[str] = ()) -> None:
        self._pm = pluggy.PluginManager(hookspecs.PROJECT)
        self._pm.add_hookspecs(hookspecs)
        for name in blocked:
            self._pm.set_blocked(name)
        self._components: dict[tuple[str, str], RegisteredComponent] = {}
        self._lowerings: dict[tuple[str, str], RegisteredLowering] = {}
        self._families: dict[str, RegisteredFamily] = {}
        self._failures: list[PluginFailure] = []
        #: plugins to import when first needed: name -> (module path, the kinds it contributes)
        self._deferred: dict[str, tuple[str, tuple[str, ...]]] = {}
        self._loading = threading.RLock()

    @property
    def plugin_manager(self) -> pluggy.PluginManager:
        """The pluggy plugin manager, every deferred plugin registered in it."""
        self._load_deferred()
        return self._pm

    @property
    def failures(self) -> list[PluginFailure]:
        """The plugins that could not be loaded, each with the reason."""
        self._load_deferred()
        return self._failures

    @property
    def deferred(self) -> list[str]:
        """The plugins deferred and not registered yet (:meth:`defer_plugin`), sorted."""
        return sorted(self._deferred)

    # -- plugins ---------------------------------------------------------------------------
    def defer_plugin(self, name: str, module: str, kinds: Iterable[str]) -> None:
        """Register the plugin module ``module`` as ``name`` when it is first needed: when a
        component of one of ``kinds`` is looked up, or lowerings, checkpoint families, the
        plugin list or another plugin's registration (whose contributions may name its own).
        A module that needs torch, where torch is not installed, is recorded in ``failures``."""
        if not self._pm.is_blocked(name):
            self._deferred[name] = (module, tuple(kinds))

    def _load_deferred(self, kind: str | None = None) -> None:
        """Register the deferred plugins contributing ``kind`` (None: all of them)."""
        if not self._deferred:
            return
        with self._loading:  # a server's threads may ask at once: each plugin is loaded once
            for name, (module, kinds) in list(self._deferred.items()):
                if kind is not None and kind not in kinds:
                    continue
                del self._deferred[name]
                try:
                    plugin = importlib.import_module(module)
                except ModuleNotFoundError as exc:
                    if exc.name not in TORCH_EXTRA:
                        raise
                    # an install without torch (running exports only): the model's components are not there
                    self._failures.append(PluginFailure(name, None, f"needs torch, which is not installed; "
                                                        f"{TORCH_INSTALL} to build or export models"))
                    continue
                self._register(plugin, name, None)

    def register_plugin(
        self, plugin: object, name: str | None = None, *, distribution: str | None = None
    ) -> str | None:
        """Register a plugin (module or object with hook implementations) and index what it
        contributes.

        Returns the plugin's name, or None when that name is blocked.
        Raises :class:`PluginError` naming the plugin when registration, a hook, or a name
        conflict fails; the plugin is then left unregistered.
        """
        self._load_deferred()  # first: this plugin's contributions may name theirs
        return self._register(plugin, name, distribution)

    def _register(self, plugin: object, name: str | None, distribution: str | None) -> str | None:
        pm = self._pm
        name = name or pm.get_canonical_name(plugin)
        if pm.is_blocked(name):
            return None
        where = origin(name, distribution)
        try:
            pm.register(hashable_plugin(plugin, hookspecs.PROJECT), name=name)
        except ValueError as exc:
            raise PluginError(
                f"Cannot register {where}: {exc}. Plugin names must be unique; pass another "
                "name= or unregister the existing plugin first."
            ) from exc
        except pluggy.PluginValidationError as exc:
            raise PluginError(f"{where} is not a valid transformer_kit plugin: {exc}") from exc
        try:
            components = self._contributions(name, where, "transformer_kit_components", Component)
            lowerings = self._contributions(name, where, "transformer_kit_lowerings", Lowering)
            families = self._contributions(name, where, "transformer_kit_checkpoint_families",
                                           CheckpointFamily)
            new_components = index_contributions(self._components, components,
                                                 lambda c: (c.kind, c.name), lambda c: f"{c.kind} {c.name!r}",
                                                 RegisteredComponent, name, distribution)
            self._check_lowerings(where, lowerings, new_components)
            lowerings += [c.lowering for c in components if c.lowering is not None]
            new_lowerings = index_contributions(self._lowerings, lowerings, lambda lo: (lo.kind, lo.name),
                                                lambda lo: f"the lowering of {lo.kind} {lo.name!r}",
                                                RegisteredLowering, name, distribution)
            new_families = index_contributions(self._families, families, lambda f: f.model_type,
                                               lambda f: f"checkpoint family {f.model_type!r}",
                                               RegisteredFamily, name, distribution)
        except BaseException:
            pm.unregister(name=name)
            raise
        self._components.update(new_components)
        self._lowerings.update(new_lowerings)
        self._families.update(new_families)
        return name

    def _check_lowerings(self, where: str, lowerings: list[Lowering], new: Mapping) -> None:
        """Refuse a lowering (of the ``transformer_kit_lowerings`` hook) whose component is
        registered neither before nor by the same plugin (``new``): a typo would otherwise send
        the component to tracing unnoticed."""
        for lowering in lowerings:
            key = (lowering.kind, lowering.name)
            if not lowering.kind:
                raise PluginError(f"{where}: a lowering of transformer_kit_lowerings names no component; "
                                  "give its kind and name, or pass it to its Component(lowering=...).")
            if key not in self._components and key not in new:
                names = sorted(n for k, n in [*self._components, *new] if k == lowering.kind)
                raise PluginError(
                    f"{where} lowers {lowering.kind} {lowering.name!r}, which no registered plugin "
                    f"provides.{did_you_mean(lowering.name, names)} Registered {lowering.kind} "
                    f"components: {', '.join(names) or '(none)'}. Register the component first (its "
                    "plugin), or give the lowering to its Component(lowering=...).")

    def unregister_plugin(self, name: str) -> None:
        """Remove a plugin and everything it contributed."""
        if self._deferred.pop(name, None) is not None:
            return
        if self.plugin_manager.get_plugin(name) is None:
            raise PluginError(
                f"No plugin named {name!r} is registered; registered: "
                f"{', '.join(self.plugins()) or '(none)'}."
            )
        self.plugin_manager.unregister(name=name)
        self._components = {k: e for k, e in self._components.items() if e.plugin != name}
        self._lowerings = {k: e for k, e in self._lowerings.items() if e.plugin != name}
        self._families = {k: e for k, e in self._families.items() if e.plugin != name}

    def plugins(self) -> list[str]:
        """Names of the registered plugins, sorted."""
        return sorted(n for n, p in self.plugin_manager.list_name_plugin() if p is not None)

    def plugin_hook(self, name: str, hook: str) -> pluggy.HookCaller:
        """A pluggy hook caller for ``hook`` that calls only the plugin ``name``'s
        implementations (``subset_hook_caller``: tracing and that plugin's wrappers apply)."""
        pm = self._pm
        others = [p for n, p in pm.list_name_plugin() if n != name and p is not None]
        return pm.subset_hook_caller(hook, remove_plugins=others)

    def load_entry_points(self, group: str = ENTRY_POINT_GROUP) -> None:
        """Load third-party plugins from an entry-point group; failures are recorded and warned."""
        for ep in metadata.entry_points(group=group):
            dist = ep.dist.name if ep.dist is not None else None
            if self._pm.is_blocked(ep.name) or self._pm.has_plugin(ep.name):
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
        self._failures.append(PluginFailure(plugin, dist, error))
        warnings.warn(
            f"transformer_kit: {origin(plugin, dist)} was not loaded: {error}",
            RuntimeWarning,
            stacklevel=3,
        )

    def _contributions(self, name: str, where: str, hook: str, expected: type) -> list[Any]:
        """What plugin ``name`` returns from ``hook``: a list of ``expected`` items."""
        try:
            results = self.plugin_hook(name, hook)()
        except Exception as exc:
            raise PluginError(f"{where} raised in {hook}: {type(exc).__name__}: {exc}") from exc
        items: list[Any] = []
        for result in results:
            if isinstance(result, (expected, str)) or not isinstance(result, Iterable):
                raise PluginError(f"{where}: {hook} must return a list of tk.{expected.__name__}, "
                                  f"got {type(result).__name__}.")
            for item in result:
                if not isinstance(item, expected):
                    raise PluginError(f"{where}: {hook} returned a {type(item).__name__}; every "
                                      f"item must be a tk.{expected.__name__}.")
                items.append(item)
        return items

    # -- components ------------------------------------------------------------------------
    def names(self, kind: str, pattern: str | None = None) -> list[str]:
        """Sorted names of the components of ``kind``, optionally filtered by a glob pattern."""
        _check_kind(kind)
        self._load_deferred(kind)
        names = sorted(name for k, name in self._components if k == kind)
        return [n for n in names if fnmatch.fnmatchcase(n, pattern)] if pattern else names

    def entry(self, kind: str, name: str) -> RegisteredComponent:
        """The component with its plugin and distribution; raises UnknownComponentError."""
        _check_kind(kind)
        self._load_deferred(kind)
        try:
            return self._components[(kind, name)]
        except KeyError:
            allowed = self.names(kind)
            unloaded = "".join(f" Plugin {f.plugin!r} was not loaded: {f.error}." for f in self.failures)
            raise UnknownComponentError(
                f"Unknown {kind} component {name!r}.{did_you_mean(name, allowed)} "
                f"Registered {kind} components: {', '.join(allowed) or '(none)'}.{unloaded} "
                "Install or register the plugin that provides it."
            ) from None

    def get(self, kind: str, name: str) -> Component:
        """The component registered as ``name`` of ``kind``."""
        return self.entry(kind, name).component

    def entries(self, kind: str | None = None) -> list[RegisteredComponent]:
        """All registered components (of one kind), sorted by kind then name."""
        if kind is not None:
            _check_kind(kind)
        self._load_deferred(kind)
        items = sorted(self._components.items())
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
        label = f"{kind} {name!r} ({origin(entry.plugin, entry.distribution)})"
        kwargs = bind_factory_arguments(entry.component.factory, label, dict(context or {}), params)
        try:
            made = entry.component.factory(**kwargs)
            mark_component(made, entry)  # the export finds its lowering by it
            return made
        except TransformerKitError:
            raise
        except ValueError as exc:
            raise ConfigError(f"{label}: {exc}") from exc
        except Exception as exc:
            raise ComponentError(
                f"The factory of {label} raised {type(exc).__name__}: {exc}"
            ) from exc

    # -- lowerings ---------------------------------------------------------------------------
    def lowering(self, kind: str, name: str) -> RegisteredLowering | None:
        """How component ``kind``/``name`` writes its ONNX nodes, or None (the export traces it)."""
        self._load_deferred(kind)
        return self._lowerings.get((kind, name))

    def lowerings(self) -> list[RegisteredLowering]:
        """Every registered lowering, sorted by kind then name."""
        self._load_deferred()
        return [e for _, e in sorted(self._lowerings.items())]

    # -- checkpoint families ---------------------------------------------------------------
    def model_types(self) -> list[str]:
        """The Hugging Face ``model_type``s some plugin can load, sorted."""
        self._load_deferred()
        return sorted(self._families)

    def family(self, model_type: str) -> RegisteredFamily:
        """The family loading ``model_type``; raises :class:`CheckpointError` listing the others."""
        self._load_deferred()
        try:
            return self._families[model_type]
        except (KeyError, TypeError):
            hint = did_you_mean(str(model_type), self._families)
            raise CheckpointError(
                f"model_type {model_type!r} is not supported by any installed plugin.{hint} "
                f"Supported: {', '.join(self.model_types()) or '(none)'}. A plugin adds one with "
                "the transformer_kit_checkpoint_families hook (see docs/plugins.md)."
            ) from None

    def families(self) -> list[RegisteredFamily]:
        """Every registered checkpoint family, sorted by ``model_type``."""
        return [self._families[t] for t in self.model_types()]


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
    for name, (module, kinds) in BUILTIN_PLUGINS.items():
        registry.defer_plugin(name, module, kinds)
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
