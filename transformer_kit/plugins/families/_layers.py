"""Per-layer variation shared by the families whose layers differ (Gemma 2 and 3, SmolLM3):
config.json's ``layer_types`` as the kit's ``layer_types`` and ``layer_variants``."""

from __future__ import annotations

from transformer_kit.checkpoints import require

#: transformers' layer type names the kit maps.
SLIDING, FULL = "sliding_attention", "full_attention"


def hf_layer_types(hf: dict, family: str, default_every: int | None = None) -> list[str]:
    """config.json's ``layer_types`` (or, when absent, a sliding layer except every
    ``default_every``-th one, as transformers' configs default; None: every layer global);
    refuses other types."""
    layers = hf["num_hidden_layers"]
    types = hf.get("layer_types")
    if types is None and default_every is None:
        types = [FULL] * layers
    elif types is None:
        types = [SLIDING if (i + 1) % default_every else FULL for i in range(layers)]
    require(len(types) == layers, family,
            f"layer_types of {len(types)} entries for num_hidden_layers {layers}")
    unknown = sorted(set(types) - {SLIDING, FULL})
    require(not unknown, family, f"layer_types {unknown} (the kit maps {SLIDING} and {FULL})")
    return list(types)


def variation(names: list[str], variants: dict[str, dict]) -> dict:
    """``{layer_types, layer_variants}`` for a config: each layer's variant name and what each
    variant replaces (only the variants used); {} when every layer is the top-level one."""
    used = {name: variants[name] for name in dict.fromkeys(names)}
    if not any(used.values()):
        return {}
    return {"layer_types": list(names), "layer_variants": used}
