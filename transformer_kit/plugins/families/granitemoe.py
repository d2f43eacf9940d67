"""Granite MoE (``GraniteMoeForCausalLM``, IBM Granite 3.0/3.1 MoE): Granite's layout and
multipliers (see :mod:`~transformer_kit.plugins.families.granite`) with a mixture of
``num_local_experts`` SwiGLU experts of ``intermediate_size`` in every layer
(``block_sparse_moe``): the top ``num_experts_per_tok`` router logits, then a softmax over those
k (the ``moe`` component's ``softmax_topk`` router).

The checkpoint's experts are fused per layer: ``block_sparse_moe.input_linear.weight``
(experts, 2 x intermediate_size, hidden), each expert's gate rows first, then its up rows;
``output_linear.weight`` (experts, hidden, intermediate_size); the router
``router.layer.weight`` (experts, hidden). transformers 5 holds the same tensors as
``experts.gate_up_proj``, ``experts.down_proj`` and ``router.weight``; both are read, and
experts held apart (``mlp.experts.{e}.gate_proj``, as a GGUF file gives them) too.

``GraniteMoeSharedForCausalLM`` (:mod:`~transformer_kit.plugins.families.granitemoeshared`)
adds a SwiGLU shared expert of ``shared_intermediate_size`` on every token
(``shared_mlp.input_linear`` (2 x shared, hidden), gate rows first; ``output_linear``), added
ungated. The ``moe`` component scales its shared expert by ``sigmoid(shared_expert_gate(x))``;
a zero gate gives exactly 1/2, so the shared expert's down projection is stored doubled (both
steps exact in floating point) and the sum is transformers' own.
"""

from __future__ import annotations

import functools

import torch

from transformer_kit import CheckpointFamily, ModelConfig
from transformer_kit.checkpoints import StateDict, Weights, require
from transformer_kit.plugins.families._experts import QWEN_NAMES, copy_experts, expert_count
from transformer_kit.plugins.families.granite import granite_config
from transformer_kit.plugins.families.llama import llama_weights


def granitemoe_config(hf: dict, family: str = "granitemoe") -> dict:
    """Granite's config with ``feedforward: moe`` (``softmax_topk``; a shared expert of
    ``shared_intermediate_size`` when it is above 0)."""
    experts = expert_count(hf, family)
    require(experts >= 1, family, f"num_local_experts {experts} (at least one expert)")
    config = granite_config(hf, family)
    shared = hf.get("shared_intermediate_size", 0) or 0
    require(isinstance(shared, int) and shared >= 0, family,
            f"shared_intermediate_size {shared!r} (a width, 0 for none)")
    config["feedforward"] = {"name": "moe", "num_experts": experts, "top_k": hf["num_experts_per_tok"],
                             "router": "softmax_topk",
                             **({"shared_expert_d_ff": shared} if shared else {})}
    return config


def _copy_shared(out: StateDict, w: Weights, ff: str, theirs: str) -> None:
    """The ungated shared expert ``theirs.shared_mlp`` (or ``shared_expert``, apart) as the
    ``moe`` component's sigmoid-gated one: a zero gate (sigmoid 1/2), the down projection
    doubled."""
    if w.has(f"{theirs}.shared_mlp.input_linear.weight"):
        gate, up = w.get(f"{theirs}.shared_mlp.input_linear.weight").chunk(2, dim=0)  # 2 x (shared, hidden)
        down = w.get(f"{theirs}.shared_mlp.output_linear.weight")  # (hidden, shared)
    else:
        gate, up, down = (w.get(f"{theirs}.mlp.shared_expert.{name}.weight") for name in QWEN_NAMES)
    out[f"{ff}.shared_expert.gate.weight"] = gate
    out[f"{ff}.shared_expert.up.weight"] = up
    out[f"{ff}.shared_expert.down.weight"] = down * 2  # times sigmoid(0) = 1/2: down exactly
    out[f"{ff}.shared_expert_gate.weight"] = torch.zeros(1, gate.shape[1])


def copy_granitemoe(out: StateDict, w: Weights, cfg: ModelConfig, ours: str, theirs: str, i: int) -> None:
    """Layer ``i``'s router, experts and shared expert -> ``{ours}.feedforward``."""
    spec, ff, source = cfg.layer_component("feedforward", i) or cfg.feedforward, f"{ours}.feedforward", \
        f"{theirs}.block_sparse_moe"
    experts = spec.params["num_experts"]
    if w.has(f"{theirs}.mlp.experts.0.gate_proj.weight"):  # apart, as a GGUF file gives them
        out[f"{ff}.router.weight"] = w.get(f"{theirs}.mlp.gate.weight")
        copy_experts(out, w, ff, f"{theirs}.mlp", experts)
    else:
        out[f"{ff}.router.weight"] = w.get(f"{source}.router.layer.weight", f"{source}.router.weight")
        gate_up = w.get(f"{source}.input_linear.weight", f"{source}.experts.gate_up_proj")  # (E, 2I, H)
        down = w.get(f"{source}.output_linear.weight", f"{source}.experts.down_proj")  # (E, H, I)
        for e in range(experts):
            gate, up = gate_up[e].chunk(2, dim=0)  # (2I, H) -> 2 x (I, H): the gate's rows first
            out[f"{ff}.experts.{e}.gate.weight"] = gate
            out[f"{ff}.experts.{e}.up.weight"] = up
            out[f"{ff}.experts.{e}.down.weight"] = down[e]
    if spec.params.get("shared_expert_d_ff", 0):
        _copy_shared(out, w, ff, theirs)


FAMILY = CheckpointFamily("granitemoe", granitemoe_config,
                          functools.partial(llama_weights, feedforward=copy_granitemoe),
                          probe="embed_tokens.weight", prefixes=("model.", ""),
                          description="GraniteMoeForCausalLM")
