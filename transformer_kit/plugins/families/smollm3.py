"""SmolLM3 (``SmolLM3ForCausalLM``): Llama's layout where some layers use no positions at all
(``no_rope_layers``: 0 for a layer without rotary, every fourth by default) and, with
``use_sliding_window``, sliding-window layers (``layer_types``)."""

from __future__ import annotations

from transformer_kit import CheckpointFamily
from transformer_kit.checkpoints import require
from transformer_kit.plugins.families._layers import SLIDING, hf_layer_types, variation
from transformer_kit.plugins.families.llama import llama_config, llama_weights


def smollm3_config(hf: dict) -> dict:
    layers = hf["num_hidden_layers"]
    every = hf.get("no_rope_layer_interval", 4)
    rope = hf.get("no_rope_layers") or [int((i + 1) % every != 0) for i in range(layers)]
    require(len(rope) == layers, "smollm3",
            f"no_rope_layers of {len(rope)} entries for num_hidden_layers {layers}")
    types = hf_layer_types(hf, "smollm3")
    sliding = bool(hf.get("use_sliding_window")) and hf.get("sliding_window") is not None
    names, variants = [], {}
    for layer_type, rotates in zip(types, rope, strict=True):
        name = layer_type + ("" if rotates else "_no_rope")
        own: dict = {} if rotates else {"positional": "none"}
        if layer_type == SLIDING and sliding:
            own["mask"] = {"name": "sliding_window", "window": hf["sliding_window"]}
        names.append(name)
        variants[name] = own
    return {**llama_config({**hf, "mlp_bias": hf.get("mlp_bias", False)}, "smollm3"),
            **variation(names, variants)}


FAMILY = CheckpointFamily("smollm3", smollm3_config, llama_weights, probe="embed_tokens.weight",
                          prefixes=("model.", ""), description="SmolLM3ForCausalLM")
