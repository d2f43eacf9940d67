"""OLMoE (``OlmoeForCausalLM``): Llama's pre-norm layout with the whole q and k projections
normalised by RMSNorm before rotary (``qk_norm: rmsnorm``, as OLMo 2, but norms before the
sub-layers) and a mixture of ``num_experts`` SwiGLU experts of ``intermediate_size`` in every
layer: a softmax over all experts, the top ``num_experts_per_tok``, renormalised only when
``norm_topk_prob`` (false in OLMoE-1B-7B). ``clip_qkv`` is refused."""

from __future__ import annotations

import functools

from transformer_kit import CheckpointFamily
from transformer_kit.checkpoints import require
from transformer_kit.plugins.families._experts import copy_moe, expert_count
from transformer_kit.plugins.families.llama import llama_config, llama_weights


def olmoe_config(hf: dict) -> dict:
    require(hf.get("clip_qkv") is None, "olmoe",
            f"clip_qkv {hf.get('clip_qkv')!r} (clamping q, k and v is not mapped; it must be null)")
    config = llama_config({**hf, "mlp_bias": False}, "olmoe")
    config["qk_norm"] = {"name": "rmsnorm", "eps": hf.get("rms_norm_eps", 1e-5)}
    config["feedforward"] = {"name": "moe", "num_experts": expert_count(hf, "olmoe"),
                             "top_k": hf["num_experts_per_tok"], "router": "softmax",
                             "normalize": bool(hf.get("norm_topk_prob", False))}
    return config


FAMILY = CheckpointFamily("olmoe", olmoe_config, functools.partial(llama_weights, feedforward=copy_moe),
                          probe="embed_tokens.weight", prefixes=("model.", ""),
                          description="OlmoeForCausalLM")
