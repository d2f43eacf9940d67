"""Granite MoE with a shared expert (``GraniteMoeSharedForCausalLM``): Granite MoE's mapping
(:mod:`~transformer_kit.plugins.families.granitemoe`) with ``shared_intermediate_size`` read as
the ``moe`` component's shared expert (``shared_mlp``, added ungated: stored as a zero sigmoid
gate and a doubled down projection, exactly)."""

from __future__ import annotations

import functools

from transformer_kit import CheckpointFamily
from transformer_kit.plugins.families.granitemoe import copy_granitemoe, granitemoe_config
from transformer_kit.plugins.families.llama import llama_weights

FAMILY = CheckpointFamily("granitemoeshared", functools.partial(granitemoe_config, family="granitemoeshared"),
                          functools.partial(llama_weights, feedforward=copy_granitemoe),
                          probe="embed_tokens.weight", prefixes=("model.", ""),
                          description="GraniteMoeSharedForCausalLM")
