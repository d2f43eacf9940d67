"""Mixtral (``MixtralForCausalLM``): Mistral's layout (a sliding window when ``sliding_window``
is set) with a mixture of ``num_local_experts`` SwiGLU experts of ``intermediate_size`` in every
layer (``block_sparse_moe``): a softmax over all experts, the top ``num_experts_per_tok``, their
weights always renormalised to sum 1. ``router_jitter_noise`` acts in training only."""

from __future__ import annotations

from transformer_kit import CheckpointFamily, ModelConfig
from transformer_kit.checkpoints import StateDict, Weights
from transformer_kit.plugins.families._experts import MIXTRAL_NAMES, copy_moe, expert_count
from transformer_kit.plugins.families.llama import llama_weights
from transformer_kit.plugins.families.mistral import mistral_config


def mixtral_config(hf: dict) -> dict:
    config = mistral_config(hf, "mixtral")
    config["feedforward"] = {"name": "moe", "num_experts": expert_count(hf, "mixtral"),
                             "top_k": hf["num_experts_per_tok"], "router": "softmax",
                             "normalize": True}
    return config


def _copy_block(out: StateDict, w: Weights, cfg: ModelConfig, ours: str, theirs: str, i: int) -> None:
    """A layer's experts: ``block_sparse_moe`` (w1, w3, w2) as the Hub's files hold them, or
    ``mlp`` as transformers 5 names them in memory."""
    if w.has(f"{theirs}.block_sparse_moe.gate.weight"):
        copy_moe(out, w, cfg, ours, theirs, i, block="block_sparse_moe", names=MIXTRAL_NAMES)
    else:
        copy_moe(out, w, cfg, ours, theirs, i)


def mixtral_weights(hf: dict, w: Weights, cfg: ModelConfig) -> StateDict:
    return llama_weights(hf, w, cfg, feedforward=_copy_block)


FAMILY = CheckpointFamily("mixtral", mixtral_config, mixtral_weights, probe="embed_tokens.weight",
                          prefixes=("model.", ""), description="MixtralForCausalLM")
