"""What a config's ``layer_types`` and ``layer_variants`` must satisfy (per-layer variation:
Gemma 2 and 3's sliding and global layers, SmolLM3's layers without positions)."""

from __future__ import annotations

from typing import Any

from transformer_kit.core.component import LAYER_KINDS
from transformer_kit.core.errors import did_you_mean


def layer_type_problems(config: Any) -> list[str]:
    """Sentences naming what is wrong with ``config``'s layer types (a ModelConfig being
    validated; empty: nothing)."""
    types, variants = config.layer_types, config.layer_variants
    if types is None:
        return ["'layer_variants' is given without 'layer_types'; name each layer's variant "
                "in 'layer_types' (one entry per layer)"] if variants else []
    problems = []
    if config.architecture == "encoder_decoder":
        problems.append("'layer_types' applies to decoder and encoder models, not "
                        "encoder_decoder; remove it")
    elif len(types) != config.num_layers:
        problems.append(f"'layer_types' has {len(types)} entries but the model has "
                        f"{config.num_layers} layers ('num_layers'); give one per layer")
    unknown = sorted(set(types) - set(variants))
    if unknown:
        problems.append(f"'layer_types' names {', '.join(map(repr, unknown))}, not a key of "
                        f"'layer_variants' (keys: {', '.join(map(repr, variants)) or 'none'}); "
                        "add it there, with {} for the top-level components")
    unused = sorted(set(variants) - set(types))
    if unused:
        problems.append(f"'layer_variants' has {', '.join(map(repr, unused))}, which no entry "
                        "of 'layer_types' names; remove it or use it")
    for name, kinds in variants.items():
        for kind in sorted(set(kinds) - set(LAYER_KINDS)):
            problems.append(f"'layer_variants.{name}' replaces {kind!r}, which cannot vary by "
                            f"layer.{did_you_mean(kind, LAYER_KINDS)} Kinds that can: "
                            f"{', '.join(LAYER_KINDS)}")
        if "qk_norm" in kinds and config.qk_norm is None:
            problems.append(f"'layer_variants.{name}' replaces 'qk_norm', but the model has "
                            "none; set the top-level 'qk_norm' first")
    return problems
