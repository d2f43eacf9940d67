"""Gemma 3's language model inside ``Gemma3ForConditionalGeneration`` (model_type ``gemma3``):
``text_config`` read as a ``gemma3_text`` checkpoint and the ``language_model`` weights; the
vision tower and its projector are not loaded (text in, text out)."""

from __future__ import annotations

from transformer_kit import CheckpointFamily
from transformer_kit.checkpoints import require
from transformer_kit.plugins.families.gemma2 import gemma2_weights
from transformer_kit.plugins.families.gemma3_text import gemma3_text_config


def gemma3_config(hf: dict) -> dict:
    text = hf.get("text_config")
    require(isinstance(text, dict), "gemma3", "no text_config (the language model's config)")
    return gemma3_text_config({"tie_word_embeddings": hf.get("tie_word_embeddings", True), **text},
                              "gemma3")


FAMILY = CheckpointFamily("gemma3", gemma3_config, gemma2_weights, probe="embed_tokens.weight",
                          prefixes=("language_model.model.", "model.language_model."),
                          description="Gemma3ForConditionalGeneration (its language model)")
