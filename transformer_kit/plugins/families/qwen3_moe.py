"""Qwen3-MoE (``Qwen3MoeForCausalLM``): Qwen3's layout (each query and key head normalised by an
RMSNorm before rotary) with a mixture of experts in place of the MLP: ``num_experts`` SwiGLU
experts of ``moe_intermediate_size``, the top ``num_experts_per_tok`` of a softmax over all of
them run on each token, their weights renormalised when ``norm_topk_prob``. Layers listed in
``mlp_only_layers``, or off the ``decoder_sparse_step``, keep a dense SwiGLU of
``intermediate_size`` (the kit's ``layer_types``). A sliding window covers every layer when
``use_sliding_window``."""

from __future__ import annotations

import functools

from transformer_kit import CheckpointFamily
from transformer_kit.checkpoints import require
from transformer_kit.plugins.families._experts import copy_moe, expert_count, moe_layers
from transformer_kit.plugins.families.llama import llama_config, llama_weights


def qwen_moe_spec(hf: dict, family: str) -> dict:
    """The ``moe`` component of a Qwen-MoE config: a softmax over all experts, then the top-k,
    renormalised when ``norm_topk_prob``."""
    return {"name": "moe", "num_experts": expert_count(hf, family), "top_k": hf["num_experts_per_tok"],
            "expert_d_ff": hf["moe_intermediate_size"], "router": "softmax",
            "normalize": bool(hf.get("norm_topk_prob", False))}


def qwen3_moe_config(hf: dict) -> dict:
    config = llama_config({**hf, "mlp_bias": False}, "qwen3_moe")
    config["qk_norm"] = {"name": "per_head_rmsnorm", "eps": hf.get("rms_norm_eps", 1e-6)}
    if hf.get("use_sliding_window"):  # transformers masks every layer alike
        window = hf.get("sliding_window")
        require(isinstance(window, int) and window > 0, "qwen3_moe",
                f"use_sliding_window true and sliding_window {window!r} (a positive integer)")
        config["mask"] = {"name": "sliding_window", "window": window}
    config.update(moe_layers(hf, "qwen3_moe", qwen_moe_spec(hf, "qwen3_moe"), {"name": "swiglu"}))
    return config


FAMILY = CheckpointFamily("qwen3_moe", qwen3_moe_config,
                          functools.partial(llama_weights, feedforward=copy_moe),
                          probe="embed_tokens.weight", prefixes=("model.", ""),
                          description="Qwen3MoeForCausalLM")
