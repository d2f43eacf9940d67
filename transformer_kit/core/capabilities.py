"""Which components may be combined: each one's required capabilities provided by the others,
and a causal mask wherever a decoder attends (the top-level components and each layer
variant's)."""

from __future__ import annotations

from transformer_kit.core.component import KEY_KINDS, MODEL_KINDS
from transformer_kit.core.config import ModelConfig
from transformer_kit.core.errors import ConfigError
from transformer_kit.core.registry import Registry


def check_capabilities(config: ModelConfig, registry: Registry) -> None:
    """Refuse a combination of components that cannot work together, with a sentence: the
    top-level components, and each layer variant's with them."""
    combinations = {"": config.components()}
    for name, kinds in config.variant_components().items():
        combinations[f" (in layer_variants.{name})"] = {**config.components(), **kinds}
    for where, specs in combinations.items():
        _check_combination(config, registry, specs, where)


def _check_combination(config: ModelConfig, registry: Registry, specs: dict, where: str) -> None:
    chosen = {key: registry.get(KEY_KINDS.get(key, key), spec.name) for key, spec in specs.items()}
    provided = set().union(*(c.provides for c in chosen.values()))
    for kind, comp in chosen.items():
        for need in sorted(comp.requires - provided):
            offering = [f"{k} {c.name!r}" for k in MODEL_KINDS for c in
                        (registry.get(k, n) for n in registry.names(k)) if need in c.provides]
            raise ConfigError(
                f"{kind} {comp.name!r}{where} needs {need!r}, which the chosen components do not "
                f"provide. Components that provide it: {', '.join(offering) or '(none)'}."
            )
    if config.architecture != "encoder" and "causal" not in chosen["mask"].provides:
        causal = [n for n in registry.names("mask") if "causal" in registry.get("mask", n).provides]
        raise ConfigError(
            f"mask {chosen['mask'].name!r}{where} is not causal, but a {config.architecture} "
            f"model's decoder must not see future tokens. Causal masks: {', '.join(causal)}."
        )
