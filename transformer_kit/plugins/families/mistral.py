"""Mistral (``MistralForCausalLM``): Llama's layout with a sliding attention window
(``sliding_window``: each query sees itself and the window - 1 positions before it, in the
prompt and in every cached step) and grouped KV heads."""

from __future__ import annotations

from transformer_kit import CheckpointFamily
from transformer_kit.checkpoints import require
from transformer_kit.plugins.families.llama import llama_config, llama_weights


def mistral_config(hf: dict, family: str = "mistral") -> dict:
    """Llama's config with Mistral's sliding window; ``family`` names the refusals (Mixtral's
    attention is Mistral's)."""
    config = llama_config({**hf, "attention_bias": False, "mlp_bias": False}, family)
    window = hf.get("sliding_window")
    require(window is None or (isinstance(window, int) and window > 0), family,
            f"sliding_window {window!r} (a positive integer or null)")
    if window is not None:
        config["mask"] = {"name": "sliding_window", "window": window}
    return config


FAMILY = CheckpointFamily("mistral", mistral_config, llama_weights, probe="embed_tokens.weight",
                          prefixes=("model.", ""), description="MistralForCausalLM")
