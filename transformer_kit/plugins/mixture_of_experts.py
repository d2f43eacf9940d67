"""A mixture of experts as a feed-forward component (``moe``): a router scores each token
against ``num_experts`` gated feed-forwards, the ``top_k`` best run on it and their outputs are
summed by the router's weights; an optional shared expert, gated by a sigmoid, runs on every
token (Qwen2-MoE).

The routers, on the logits ``l = router(x)`` (tokens, num_experts):

- ``softmax``: ``p = softmax(l)`` over all experts, then the top-k of ``p`` (Mixtral, Qwen2-MoE,
  Qwen3-MoE, OLMoE); with ``normalize`` the k weights are divided by their sum (Mixtral always;
  Qwen's and OLMoE's ``norm_topk_prob``).
- ``softmax_topk``: the top-k logits, then a softmax over those k (gpt-oss). The same weights as
  ``softmax`` with ``normalize`` (exp(l_i) / sum over the k of exp(l_j)), computed another way.
- ``sigmoid``: ``sigmoid(l)``, then its top-k; ``normalize`` divides them by their sum.

PyTorch computes the experts grouped: the (token, expert) pairs are sorted by expert, each
expert that received tokens runs once on its tokens, and the outputs are added back to their
tokens by the router's weights. No expert runs on a token that did not choose it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from transformer_kit import get_registry
from transformer_kit.core.errors import ConfigError, ExportError
from transformer_kit.plugins.feedforward import SwiGLU

#: The routers the component computes (see the module's docstring).
ROUTERS = ("softmax", "softmax_topk", "sigmoid")
#: What follows each reason an instance refuses export for.
_IN_PYTORCH = ("Its ONNX form is onnxruntime's fused com.microsoft MoE op (never a graph "
               "unrolled over the experts); use this model in PyTorch, where generate and chat work.")


def _whole(value: Any, name: str, minimum: int, what: str) -> int:
    """``value`` as an int of at least ``minimum``; a ValueError sentence otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum} ({what}); got {value!r}. "
                         f"Give {name}: <integer>.")
    return value


def _flag(value: Any, name: str, what: str) -> bool:
    """``value`` when it is a bool; a ValueError sentence otherwise."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false ({what}); got {value!r}.")
    return value


def make_expert(expert: str | Mapping[str, Any], d_model: int, d_ff: int, dropout: float) -> nn.Module:
    """One expert: the registered feed-forward ``expert`` of inner width ``d_ff``, which must
    declare the ``gate_up`` contract (``nn.Linear`` ``gate`` and ``up`` over the input,
    ``forward(x) == gated(gate(x), up(x))``: swiglu, geglu); ``expert`` is its name, or a
    mapping of its name and parameters (``{"name": "swiglu", "bias": true, "alpha": 1.702,
    "limit": 7.0, "up_offset": 1.0}``: gpt-oss's experts)."""
    registry = get_registry()
    gated = [e.component.name for e in registry.entries("feedforward") if "gate_up" in e.component.lowerings]
    params = dict(expert) if isinstance(expert, Mapping) else {}
    name = params.pop("name", None) if isinstance(expert, Mapping) else expert
    if not isinstance(name, str) or name not in gated:
        raise ValueError(f"expert must name a registered gated feed-forward (one declaring the "
                         f"'gate_up' contract), alone or as {{name: ..., its parameters}}; got "
                         f"{expert!r}. Gated feed-forwards: {', '.join(gated) or '(none)'}.")
    try:
        return registry.create("feedforward", name, context={"d_model": d_model, "d_ff": d_ff,
                                                              "dropout": dropout}, **params)
    except ConfigError as exc:  # named as the moe's option: the moe's own refusal
        raise ValueError(f"expert: {exc}") from exc


class MixtureOfExperts(nn.Module):
    """Top-k routed gated experts, plus an optional sigmoid-gated shared expert.

    Parameters (state-dict names): ``router`` (num_experts, d_model) [+ bias], ``experts.{e}``
    each expert's own (``gate``, ``up`` (expert_d_ff, d_model), ``down`` (d_model,
    expert_d_ff) for swiglu), ``shared_expert`` (the same with shared_expert_d_ff) and
    ``shared_expert_gate`` (1, d_model) when there is a shared expert.

    Args:
        d_model, d_ff, dropout: the model's sizes (d_ff is each expert's width by default).
        num_experts: routed experts (>= 1).
        top_k: experts each token runs (1..num_experts).
        expert: the registered gated feed-forward each expert is (``swiglu``, ``geglu``), or
            a mapping of its name and parameters (gpt-oss: swiglu with bias, alpha, limit,
            up_offset).
        expert_d_ff: each routed expert's inner width; None: d_ff.
        router: ``softmax``, ``softmax_topk`` or ``sigmoid`` (the module's docstring).
        normalize: divide the k chosen weights by their sum.
        shared_expert_d_ff: the shared expert's inner width; 0: no shared expert.
        router_bias: whether the router's linear has a bias.
    """

    def __init__(self, d_model: int, d_ff: int, dropout: float, num_experts: int, top_k: int,
                 expert: str | Mapping[str, Any] = "swiglu", expert_d_ff: int | None = None,
                 router: str = "softmax",
                 normalize: bool = False, shared_expert_d_ff: int = 0,
                 router_bias: bool = False) -> None:
        super().__init__()
        self.num_experts = _whole(num_experts, "num_experts", 1, "the routed experts")
        self.top_k = _whole(top_k, "top_k", 1, "the experts each token runs")
        if top_k > num_experts:
            raise ValueError(f"top_k ({top_k}) must not exceed num_experts ({num_experts}); each "
                             "token runs top_k distinct experts. Lower top_k or add experts.")
        width = d_ff if expert_d_ff is None else _whole(expert_d_ff, "expert_d_ff", 1,
                                                         "each expert's inner width; null: d_ff")
        if router not in ROUTERS:
            raise ValueError(f"router must be one of {', '.join(ROUTERS)}; got {router!r}. "
                             "softmax: over all experts, then the top-k; softmax_topk: the top-k "
                             "logits, then a softmax over them; sigmoid: per expert.")
        self.routing = router
        self.normalize = _flag(normalize, "normalize", "divide the top-k weights by their sum")
        shared = _whole(shared_expert_d_ff, "shared_expert_d_ff", 0,
                        "the shared expert's inner width; 0: none")
        self.router = nn.Linear(d_model, num_experts,
                                bias=_flag(router_bias, "router_bias", "a bias on the router"))
        self.experts = nn.ModuleList(make_expert(expert, d_model, width, dropout)
                                     for _ in range(num_experts))
        self.shared_expert = make_expert(expert, d_model, shared, dropout) if shared else None
        self.shared_expert_gate = nn.Linear(d_model, 1, bias=False) if shared else None

    def refusal(self) -> str:
        """Why this configuration cannot be exported to onnxruntime's ``MoE`` op; "" when it
        can (a softmax or softmax_topk router, or sigmoid with normalize; SwiGLU experts, with
        or without biases, plain or clamped: the op's fc1/fc2 biases and its activation_alpha,
        activation_beta and swiglu_limit compute them)."""
        if self.routing == "sigmoid" and not self.normalize:
            return ("A mixture of experts with router 'sigmoid' and normalize false is not exported "
                    "to ONNX: the MoE op mixes the experts by a softmax of its router input, whose "
                    "top-k weights it can renormalise but never leave as sigmoid scores (router "
                    "'sigmoid' with normalize true exports: the softmax of log(sigmoid(l)), "
                    "renormalised over the top-k, is sigmoid's top-k divided by their sum). "
                    + _IN_PYTORCH)
        if type(self.experts[0]) is not SwiGLU:
            return (f"A mixture of experts whose experts are {type(self.experts[0]).__name__} is not "
                    "exported to ONNX: the MoE op's gated activation is SwiGLU only "
                    "(silu(gate) * up, or gpt-oss's clamped form; swiglu_fusion=1); it has no "
                    "GeGLU. " + _IN_PYTORCH)
        return ""

    def route(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """x (tokens, d_model) -> (weights (tokens, top_k) in x's dtype, experts (tokens,
        top_k) int64), each row's experts in descending order of score."""
        logits = self.router(x).float()  # (tokens, num_experts), routed in float32
        if self.routing == "softmax_topk":
            top, chosen = torch.topk(logits, self.top_k, dim=-1)
            return torch.softmax(top, dim=-1).to(x.dtype), chosen
        scores = torch.softmax(logits, dim=-1) if self.routing == "softmax" else torch.sigmoid(logits)
        top, chosen = torch.topk(scores, self.top_k, dim=-1)
        if self.normalize:
            top = top / top.sum(dim=-1, keepdim=True)
        return top.to(x.dtype), chosen

    def forward(self, x: Tensor) -> Tensor:
        """x (batch, len, d_model) -> (batch, len, d_model)."""
        flat = x.reshape(-1, x.shape[-1])  # (tokens, d_model)
        weights, chosen = self.route(flat)  # (tokens, top_k) each
        pairs = chosen.flatten()  # (tokens * top_k,): pair i is token i // top_k
        order = torch.argsort(pairs, stable=True)  # the pairs grouped by expert
        counts = torch.bincount(pairs, minlength=self.num_experts).tolist()  # pairs per expert
        tokens = order // self.top_k  # (tokens * top_k,): each sorted pair's token
        grouped = flat[tokens].split(counts)  # per expert: (its pairs, d_model)
        outputs = [self.experts[e](part) for e, part in enumerate(grouped) if counts[e]]
        weighted = torch.cat(outputs) * weights.flatten()[order, None]  # (tokens * top_k, d_model)
        out = torch.zeros_like(flat).index_add_(0, tokens, weighted)
        if self.shared_expert is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(flat)) * self.shared_expert(flat)
        return out.reshape(x.shape)


def _stacked(g: Any, parts: list[Any], shape: list[int]) -> Any:
    """The weights ``parts`` concatenated along their first axis and reshaped to ``shape``: the
    weight writer folds both into the bytes it streams (nothing of it runs in onnxruntime)."""
    joined = parts[0] if len(parts) == 1 else g.op.Concat(*parts, axis=0)
    return g.shaped(g.op.Reshape(joined, shape), shape, g.float_type)


def _interleaved(g: Any, moe: MixtureOfExperts) -> Any:
    """Every expert's gate and up weights ((expert_d_ff, d_model) each) as the MoE op's fc1
    (num_experts, 2 * expert_d_ff, d_model), row 2i the gate's row i and row 2i + 1 the up's:
    each expert's gate and up side by side (Concat on axis 1: (expert_d_ff, 2 * d_model)),
    then read row by row."""
    first = moe.experts[0]
    parts = [g.op.Concat(g.weight(e.gate, "weight"), g.weight(e.up, "weight"), axis=1)
             for e in moe.experts]
    return _stacked(g, parts, [moe.num_experts, 2 * first.gate.out_features, first.gate.in_features])


def _expert_biases(g: Any, moe: MixtureOfExperts) -> tuple[Any, Any]:
    """The MoE op's fc1 bias (num_experts, 2 * expert_d_ff), each expert's gate and up biases
    interleaved like fc1's rows, and fc2 bias (num_experts, d_model); (None, None) for
    bias-free experts."""
    first = moe.experts[0]
    if first.gate.bias is None:
        return None, None
    width, d_model = first.gate.out_features, first.down.out_features
    # (expert_d_ff, 2) per expert read row by row: gate_0, up_0, gate_1, up_1, ...
    parts = [g.op.Concat(g.op.Reshape(g.weight(e.gate, "bias"), [width, 1]),
                         g.op.Reshape(g.weight(e.up, "bias"), [width, 1]), axis=1) for e in moe.experts]
    fc1 = _stacked(g, parts, [moe.num_experts, 2 * width])
    return fc1, _stacked(g, [g.weight(e.down, "bias") for e in moe.experts], [moe.num_experts, d_model])


def _activation(moe: MixtureOfExperts) -> dict[str, Any]:
    """The MoE op's SwiGLU attributes: swiglu_fusion=1, and a clamped expert's alpha, up offset
    (activation_beta) and limit (the op's defaults: 1, 0, none = plain silu(gate) * up)."""
    expert = moe.experts[0]
    attributes: dict[str, Any] = {"activation_type": "swiglu", "swiglu_fusion": 1}
    if expert.clamped:
        attributes.update(activation_alpha=expert.alpha, activation_beta=expert.up_offset)
        if expert.limit is not None:
            attributes["swiglu_limit"] = expert.limit
    return attributes


def moe_onnx(g: Any, moe: MixtureOfExperts, x: Any) -> Any:
    """x (batch, len, d_model) -> (batch, len, d_model): the router's logits (batch * len,
    num_experts) by its linear, onnxruntime's ``com.microsoft`` ``MoE`` op on x with every
    expert stacked (fc1 (E, 2 * expert_d_ff, d_model), gate/up rows interleaved; fc2 (E,
    d_model, expert_d_ff); their biases (E, 2 * expert_d_ff) and (E, d_model) when the experts
    have them), plus the shared expert gated by a sigmoid."""
    if refusal := moe.refusal():
        raise ExportError(refusal)
    d_model = moe.router.in_features
    first = moe.experts[0]
    # the token count left unnamed: one name would claim the encoder's and the decoder's equal
    flat = g.shaped(g.op.Reshape(x, [-1, d_model]), [None, d_model], g.float_type)
    logits = g.linear(moe.router, flat)  # (tokens, num_experts)
    if moe.routing == "sigmoid":  # with normalize (see refusal): log(sigmoid(l)) = -softplus(-l),
        # whose softmax over all experts, renormalised over the top-k, is sigmoid(l_i) / sum of the k
        logits = g.shaped(g.op.Neg(g.op.Softplus(g.op.Neg(logits))), [None, moe.num_experts],
                          g.float_type)
    fc1 = _interleaved(g, moe)
    fc2 = _stacked(g, [g.weight(e.down, "weight") for e in moe.experts],
                   [moe.num_experts, d_model, first.down.in_features])
    fc1_bias, fc2_bias = _expert_biases(g, moe)
    # softmax_topk's weights are softmax's renormalised ones (the module's docstring)
    normalize = int(moe.normalize or moe.routing == "softmax_topk")  # sigmoid: normalize is true
    out = g.op.MoE(x, logits, fc1, fc1_bias, fc2, fc2_bias, _domain="com.microsoft", k=moe.top_k,
                   normalize_routing_weights=normalize, **_activation(moe))
    # onnxruntime 1.31.1's CPU MoE declares MayInplace(0, 0) yet zeroes its output before it reads
    # its input: where nothing reads x after the node, the planner hands the output x's buffer and
    # the experts see zeros (Qwen3-MoE top-1: relative error 3e-3). Where(true, out, x) reads x
    # after the node (and needs its output first), so x keeps its buffer; one elementwise op.
    out = g.op.Where(g.constant(True), out, x)
    out = g.shaped(out, x.shape, g.float_type)
    if moe.shared_expert is not None:
        shared = g.call(moe.shared_expert, x)
        gate = g.op.Sigmoid(g.linear(moe.shared_expert_gate, x))  # (batch, len, 1)
        out = g.shaped(g.op.Add(out, g.op.Mul(gate, shared)), x.shape, g.float_type)
    return out
