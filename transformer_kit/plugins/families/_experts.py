"""What the mixture-of-experts families share (Qwen2-MoE, Qwen3-MoE, Mixtral, OLMoE): which
layers are sparse (config.json's ``decoder_sparse_step`` and ``mlp_only_layers``, as the kit's
``layer_types``), and copying a sparse layer's router and experts into the ``moe`` component.

A checkpoint holds each expert's projections apart (``experts.{e}.gate_proj.weight``, Mixtral's
``experts.{e}.w1.weight``), as the Hub's files and transformers' ``save_pretrained`` write
them; the fused form transformers holds in memory (``experts.gate_up_proj`` (experts, 2 x
d_ff, d_model), ``experts.down_proj`` (experts, d_model, d_ff)) is read too.
"""

from __future__ import annotations

from transformer_kit import ModelConfig
from transformer_kit.checkpoints import StateDict, Weights, copy_linear, require
from transformer_kit.plugins.families._layers import variation

#: The kit's names of a sparse and a dense layer in ``layer_types``.
SPARSE, DENSE = "sparse", "dense"
#: The projections of a SwiGLU expert in the checkpoint, as (gate, up, down).
QWEN_NAMES = ("gate_proj", "up_proj", "down_proj")
MIXTRAL_NAMES = ("w1", "w3", "w2")


def expert_count(hf: dict, family: str) -> int:
    """The routed experts: ``num_experts`` or ``num_local_experts`` (transformers writes either
    name, by family and version)."""
    count = hf.get("num_experts", hf.get("num_local_experts"))
    require(isinstance(count, int) and count >= 0, family,
            f"num_experts {count!r} (a count of experts: num_experts or num_local_experts)")
    return count


def sparse_layers(hf: dict, family: str) -> list[bool]:
    """Whether each layer is a mixture of experts, as transformers decides it: not in
    ``mlp_only_layers``, ``num_experts`` > 0, and (i + 1) a multiple of ``decoder_sparse_step``."""
    step, dense = hf.get("decoder_sparse_step", 1), hf.get("mlp_only_layers") or []
    require(isinstance(step, int) and step > 0, family,
            f"decoder_sparse_step {step!r} (a positive integer)")
    experts = expert_count(hf, family)
    return [i not in dense and experts > 0 and (i + 1) % step == 0
            for i in range(hf["num_hidden_layers"])]


def moe_layers(hf: dict, family: str, moe: dict, dense: dict) -> dict:
    """The config entries for sparse and dense layers: ``feedforward`` (``moe`` when any layer
    is sparse) and, when both kinds occur, ``layer_types``/``layer_variants`` whose ``dense``
    variant replaces the feed-forward by ``dense``."""
    sparse = sparse_layers(hf, family)
    if not any(sparse):
        return {"feedforward": dense}
    names = [SPARSE if s else DENSE for s in sparse]
    return {"feedforward": moe, **variation(names, {SPARSE: {}, DENSE: {"feedforward": dense}})}


def copy_experts(out: StateDict, w: Weights, ours: str, theirs: str, num_experts: int,
                 names: tuple[str, str, str] = QWEN_NAMES) -> None:
    """Experts ``theirs.experts`` -> ``ours.experts.{e}.gate``/``up``/``down``: apart (``names``
    give the gate, up and down projections' names) or fused (``gate_up_proj``, ``down_proj``)."""
    if w.has(f"{theirs}.experts.gate_up_proj"):
        gate_up, down = w.get(f"{theirs}.experts.gate_up_proj"), w.get(f"{theirs}.experts.down_proj")
        for e in range(num_experts):
            gate, up = gate_up[e].chunk(2, dim=0)  # (2 x d_ff, d_model) -> 2 x (d_ff, d_model)
            out[f"{ours}.experts.{e}.gate.weight"] = gate
            out[f"{ours}.experts.{e}.up.weight"] = up
            out[f"{ours}.experts.{e}.down.weight"] = down[e]
        return
    for e in range(num_experts):
        for our_name, their_name in zip(("gate", "up", "down"), names, strict=True):
            copy_linear(out, f"{ours}.experts.{e}.{our_name}", w, f"{theirs}.experts.{e}.{their_name}",
                        bias=False)


def copy_moe(out: StateDict, w: Weights, cfg: ModelConfig, ours: str, theirs: str, i: int,
             block: str = "mlp", names: tuple[str, str, str] = QWEN_NAMES) -> None:
    """Layer ``i``'s feed-forward: the ``moe`` component's router (``{block}.gate``), experts
    and shared expert (``shared_expert``, ``shared_expert_gate``), or the dense ``mlp``."""
    spec = cfg.layer_component("feedforward", i)
    if spec is None or spec.name != "moe":
        for name in ("gate", "up", "down"):
            copy_linear(out, f"{ours}.feedforward.{name}", w, f"{theirs}.mlp.{name}_proj", bias=False)
        return
    ff, source = f"{ours}.feedforward", f"{theirs}.{block}"
    copy_linear(out, f"{ff}.router", w, f"{source}.gate", bias=spec.params.get("router_bias", False))
    copy_experts(out, w, ff, source, spec.params["num_experts"], names)
    if spec.params.get("shared_expert_d_ff", 0):
        for our_name, their_name in zip(("gate", "up", "down"), QWEN_NAMES, strict=True):
            copy_linear(out, f"{ff}.shared_expert.{our_name}", w,
                        f"{source}.shared_expert.{their_name}", bias=False)
        copy_linear(out, f"{ff}.shared_expert_gate", w, f"{source}.shared_expert_gate", bias=False)
