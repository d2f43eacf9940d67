"""Qwen2 (``Qwen2ForCausalLM``): Llama's layout with biases on the q, k and v projections and
none on the output projection (``attention_out_bias: false``); a sliding window when
``use_sliding_window`` puts every layer under it."""

from __future__ import annotations

from transformer_kit import CheckpointFamily
from transformer_kit.checkpoints import require
from transformer_kit.plugins.families.llama import llama_config, llama_weights


def qwen2_config(hf: dict) -> dict:
    config = llama_config({**hf, "attention_bias": True, "mlp_bias": False}, "qwen2")
    config["attention_out_bias"] = False
    layers = hf["num_hidden_layers"]
    kinds = hf.get("layer_types") or (
        ["sliding_attention" if hf.get("use_sliding_window") and i >= hf.get("max_window_layers", 0)
         else "full_attention" for i in range(layers)])
    require(len(set(kinds)) == 1 and kinds[0] in ("full_attention", "sliding_attention"), "qwen2",
            f"layer_types {sorted(set(kinds))} (one mask serves every layer here: all full_attention, "
            "or all sliding_attention with use_sliding_window and max_window_layers 0)")
    if kinds[0] == "sliding_attention":
        window = hf.get("sliding_window")
        require(isinstance(window, int) and window > 0, "qwen2", f"sliding_window {window!r}")
        config["mask"] = {"name": "sliding_window", "window": window}
    return config


FAMILY = CheckpointFamily("qwen2", qwen2_config, llama_weights, probe="embed_tokens.weight",
                          prefixes=("model.", ""), description="Qwen2ForCausalLM")
