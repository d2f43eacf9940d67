"""Qwen2-MoE (``Qwen2MoeForCausalLM``, Qwen1.5-MoE): Qwen2's layout (biases on the q, k and v
projections when ``qkv_bias``, none on the output projection) with a mixture of experts in
place of the MLP: Qwen3-MoE's router and experts plus a shared SwiGLU expert of
``shared_expert_intermediate_size`` on every token, scaled by ``sigmoid(shared_expert_gate(x))``
(none when that size is 0). Layers listed in ``mlp_only_layers``, or off the
``decoder_sparse_step``, keep a dense SwiGLU of ``intermediate_size``. Sliding windows are
refused."""

from __future__ import annotations

import functools

from transformer_kit import CheckpointFamily
from transformer_kit.checkpoints import require
from transformer_kit.plugins.families._experts import copy_moe, moe_layers
from transformer_kit.plugins.families.llama import llama_config, llama_weights
from transformer_kit.plugins.families.qwen3_moe import qwen_moe_spec


def qwen2_moe_config(hf: dict) -> dict:
    kinds = sorted(set(hf.get("layer_types") or ["full_attention"]))
    require(not hf.get("use_sliding_window") and kinds == ["full_attention"], "qwen2_moe",
            f"use_sliding_window {hf.get('use_sliding_window')!r} and layer_types {kinds} (Qwen2-MoE's "
            "sliding windows are not mapped; every layer must be full_attention)")
    config = llama_config({**hf, "attention_bias": hf.get("qkv_bias", True), "mlp_bias": False},
                          "qwen2_moe")
    config["attention_out_bias"] = False
    shared = hf.get("shared_expert_intermediate_size", 0)
    moe = {**qwen_moe_spec(hf, "qwen2_moe"), **({"shared_expert_d_ff": shared} if shared else {})}
    config.update(moe_layers(hf, "qwen2_moe", moe, {"name": "swiglu"}))
    return config


FAMILY = CheckpointFamily("qwen2_moe", qwen2_moe_config,
                          functools.partial(llama_weights, feedforward=copy_moe),
                          probe="embed_tokens.weight", prefixes=("model.", ""),
                          description="Qwen2MoeForCausalLM")
