"""Granite (``GraniteForCausalLM``, IBM Granite 3.x): Llama's layout with four multipliers, each
an ordinary config option: ``embedding_multiplier`` -> ``embedding_scale`` (the token
embeddings), ``residual_multiplier`` -> the ``pre_norm`` block's ``residual_scale`` (what each
sub-layer adds to the residual), ``attention_multiplier`` -> the ``sdpa`` kernel's ``scale`` (in
place of 1/sqrt(head_dim)) and ``logits_scaling`` -> ``logit_scale`` = 1 / logits_scaling."""

from __future__ import annotations

import math

from transformer_kit import CheckpointFamily
from transformer_kit.checkpoints import require
from transformer_kit.plugins.families.llama import llama_config, llama_weights

_MULTIPLIERS = ("embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling")


def granite_config(hf: dict, family: str = "granite") -> dict:
    """Llama's mapping with Granite's four multipliers (``family`` names the family in a
    refusal)."""
    values = {key: hf.get(key, 1.0) for key in _MULTIPLIERS}
    for key, value in values.items():
        require(isinstance(value, (int, float)) and not isinstance(value, bool)
                and math.isfinite(value) and value > 0, family, f"{key} {value!r} (a positive number)")
    config = llama_config(hf, family)
    embedding, residual, attention, logits = (float(values[key]) for key in _MULTIPLIERS)
    config["attention"] = {"name": "sdpa", "scale": attention}
    if embedding != 1.0:
        config["embedding_scale"] = embedding
    if residual != 1.0:
        config["block"] = {"name": "pre_norm", "residual_scale": residual}
    if logits != 1.0:
        config["logit_scale"] = 1.0 / logits
    return config


FAMILY = CheckpointFamily("granite", granite_config, llama_weights, probe="embed_tokens.weight",
                          prefixes=("model.", ""), description="GraniteForCausalLM")
