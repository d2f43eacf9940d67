"""What a plugin contributes: components (a named factory of one kind, with capability metadata),
their lowerings (how a component writes its ONNX nodes) and checkpoint families (how a Hugging
Face ``model_type`` maps onto a config and weights)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: The kinds of component a model is assembled from (``qk_norm``, ``pooling``, ``frontend`` and
#: ``features`` are optional: none by default; ``pooling`` makes an encoder's sentence embedding,
#: ``frontend`` an encoder-decoder's source of features (audio) instead of token ids, ``features``
#: those features from a raw signal).
MODEL_KINDS: tuple[str, ...] = ("attention", "positional", "mask", "block", "feedforward", "norm",
                                "qk_norm", "pooling", "frontend", "features")
#: Config keys that name a component of another key's kind (the encoder's own positional
#: encoding, where it is not the decoder's).
KEY_KINDS: dict[str, str] = {"encoder_positional": "positional"}
#: The kinds a config's ``layer_variants`` may replace in single layers.
LAYER_KINDS: tuple[str, ...] = ("attention", "positional", "mask", "feedforward", "norm", "qk_norm")
#: Every kind a plugin may register: the model's, and logits processors (used by decoding).
KINDS: tuple[str, ...] = (*MODEL_KINDS, "logits_processor")

#: Fused lowerings the export layer knows, by kind (see ``Component.lowerings``).
LOWERINGS: dict[str, frozenset[str]] = {"attention": frozenset({"attention"}),
                                        "positional": frozenset({"rotary"}),
                                        "feedforward": frozenset({"gate_up"}),
                                        "mask": frozenset({"causal"})}

#: What a lowering may write, by kind: the interface's calls (``transformer_kit.core.interfaces``).
LOWERING_METHODS: dict[str, tuple[str, ...]] = {
    **{kind: ("forward",) for kind in MODEL_KINDS}, "positional": ("embed", "rotate", "score_bias")}

_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.\-]*$")


@dataclass(frozen=True)
class Component:
    """One named implementation of a kind.

    Args:
        kind: one of :data:`KINDS`.
        name: the name a config uses, unique within its kind.
        factory: called with the model's sizes and the config's params; returns the component.
            The keyword arguments each kind receives are listed in
            :mod:`transformer_kit.core.interfaces`.
        description: one line shown in listings.
        exportable: False when the component cannot be exported to ONNX.
        unexportable_reason: with ``exportable`` False, the sentences ``export_onnx`` adds to
            its refusal: why, and what to do instead.
        export_refusal: for a component that exports only some of its configurations (it stays
            ``exportable``): the module it made -> why that one cannot be exported, "" when it
            can (``moe`` with a sigmoid router and no normalizing); None: every one can.
        supports_cache: False when cached decoding would not give the uncached result.
        provides: capabilities this component offers to others (e.g. ``"score_bias"`` for an
            attention kernel that accepts an additive bias, ``"causal"`` for a causal mask).
        requires: capabilities it needs from the other components of the same model.
        lowerings: fused ONNX lowerings the export layer may put in this component's place
            because they compute exactly what it computes. ``"attention"`` (attention kernels):
            the kernel is ``softmax(q k^T * scale + mask) v`` with ``scale = kernel.scale`` or
            1/sqrt(head_dim), so self-attention exports as one ONNX ``Attention`` op per layer
            with the key/value cache inside it. ``"rotary"`` (positional encodings): ``rotate``
            turns the halves of each head's first ``rotary_dim`` features (the GPT-NeoX/Llama
            layout) by ``positions * inv_freq`` (attributes ``rotary_dim`` and ``inv_freq``
            (rotary_dim / 2,)), so q and k export as ONNX ``RotaryEmbedding`` ops on packed heads.
            ``"gate_up"`` (feed-forward): the module has ``nn.Linear`` ``gate`` and ``up`` over the
            same input and ``forward(x) == gated(gate(x), up(x))``, so a generating model's
            graphs compute gate and up as one product over the concatenated weights.
            ``"causal"`` (masks): a query sees exactly the keys at its position and before, the
            last ``window`` of them when the mask's ``window`` is set
            (``AttentionMask.window``), so a decoder's step graph over one cache buffer shared by
            past and present leaves the restriction to its attention op (onnxruntime's
            ``GroupQueryAttention``).
            Export verification checks every claim.
        lowering: how the component writes its ONNX nodes (a :class:`Lowering` whose kind and
            name are this component's: ``lowering=tk.Lowering(forward=my_onnx)``), registered
            with it; None: the export traces it (or another plugin's lowering writes it).
    """

    kind: str
    name: str
    factory: Callable[..., Any]
    description: str = ""
    exportable: bool = True
    unexportable_reason: str = ""
    export_refusal: Callable[[Any], str] | None = None
    supports_cache: bool = True
    provides: frozenset[str] = field(default_factory=frozenset)
    requires: frozenset[str] = field(default_factory=frozenset)
    lowerings: frozenset[str] = field(default_factory=frozenset)
    lowering: Lowering | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(
                f"Component kind {self.kind!r} is not one of {', '.join(KINDS)}; "
                "pick the kind whose interface the factory implements."
            )
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ValueError(
                f"Component name {self.name!r} is not allowed: use letters, digits, '_', '-' "
                "or '.', starting with a letter."
            )
        if not callable(self.factory):
            raise TypeError(
                f"Component {self.kind}/{self.name}: factory must be callable, "
                f"got {type(self.factory).__name__}."
            )
        for name in ("provides", "requires", "lowerings"):
            object.__setattr__(self, name, frozenset(getattr(self, name)))
        unknown = self.lowerings - LOWERINGS.get(self.kind, frozenset())
        if unknown:
            known = ", ".join(sorted(LOWERINGS.get(self.kind, ()))) or "(none)"
            raise ValueError(
                f"Component {self.kind}/{self.name}: lowerings {sorted(unknown)} are not known for "
                f"kind {self.kind!r}; known: {known}."
            )
        if self.lowering is not None:
            if not isinstance(self.lowering, Lowering):
                raise TypeError(f"Component {self.kind}/{self.name}: lowering must be a tk.Lowering, got "
                                f"{type(self.lowering).__name__}.")
            if self.lowering.kind not in ("", self.kind) or self.lowering.name not in ("", self.name):
                raise ValueError(f"Component {self.kind}/{self.name}: its lowering names "
                                 f"{self.lowering.kind}/{self.lowering.name}; leave the lowering's kind "
                                 "and name out (they are the component's).")
            methods = self.lowering.methods(all_kinds=True)
            object.__setattr__(self, "lowering", Lowering(self.kind, self.name, **methods))


@dataclass(frozen=True)
class Lowering:
    """How a registered component writes its ONNX nodes: the export builds its graphs from the
    lowerings of the model's components (a component without one is traced alone).

    Each function is called as ``function(g, module, *inputs)`` with the inputs of the call it
    lowers as ``onnx_ir.Value``s, shaped as the kind's interface shapes the tensors
    (:mod:`transformer_kit.core.interfaces`), and returns the call's outputs as Values (``None``
    where the interface allows it). ``g`` is the export's graph builder: ``g.op.MatMul(a, b)``
    writes a node, ``g.weight(module, "weight")`` reads a parameter or buffer, ``g.call(child,
    x)`` lowers a sub-module, ``g.linear(linear, x)`` a ``nn.Linear``
    (``transformer_kit.export.graph_builder.GraphBuilder``; docs/plugins.md has a worked example).

    Args:
        kind, name: the component lowered (registered by this plugin or another one, before
            this lowering); left out on a lowering given to its own ``Component(lowering=...)``.
        forward: the module's call (every kind but ``positional``; a mask's ``__call__``).
        embed, rotate, score_bias: a positional encoding's three points, each optional: leave
            out a point the encoding does not act at (its inherited method does nothing).
    """

    kind: str = ""
    name: str = ""
    forward: Callable[..., Any] | None = None
    embed: Callable[..., Any] | None = None
    rotate: Callable[..., Any] | None = None
    score_bias: Callable[..., Any] | None = None

    def __post_init__(self) -> None:
        if not self.kind and not self.name:  # its component's: checked when given to it
            return
        if self.kind not in LOWERING_METHODS:
            raise ValueError(f"Lowering kind {self.kind!r} is not one of {', '.join(LOWERING_METHODS)}; "
                             "name the kind of the component it lowers.")
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ValueError(f"Lowering name {self.name!r} is not a component name: use letters, "
                             "digits, '_', '-' or '.', starting with a letter.")
        allowed = LOWERING_METHODS[self.kind]
        given = {m: f for m in ("forward", "embed", "rotate", "score_bias")
                 if (f := getattr(self, m)) is not None}
        wrong = sorted(set(given) - set(allowed))
        if wrong or not given:
            raise ValueError(f"Lowering {self.kind}/{self.name}: a {self.kind} lowering writes "
                             f"{' and/or '.join(allowed)}; got {', '.join(sorted(given)) or 'none'}.")
        for method, function in given.items():
            if not callable(function):
                raise TypeError(f"Lowering {self.kind}/{self.name}: {method} must be callable, got "
                                f"{type(function).__name__}.")

    def methods(self, all_kinds: bool = False) -> dict[str, Callable[..., Any]]:
        """The calls this lowering writes, by the interface method's name (``all_kinds``: every
        one given, whatever its kind writes)."""
        names = ("forward", "embed", "rotate", "score_bias") if all_kinds else LOWERING_METHODS[self.kind]
        return {m: f for m in names if (f := getattr(self, m)) is not None}


@dataclass(frozen=True)
class CheckpointFamily:
    """One Hugging Face ``model_type`` that ``tk.from_hf`` can load.

    Args:
        model_type: the ``model_type`` of ``config.json`` (``"gpt2"``, ``"llama"``, ...).
        to_config: ``config.json`` as a dict -> a transformer_kit config dict. Raise
            :class:`~transformer_kit.CheckpointError` for variants the mapping does not cover.
        to_state_dict: ``(config.json dict, weights, ModelConfig) -> {our name: tensor}`` for
            every parameter of the model :func:`~transformer_kit.build_model` assembles from the
            config; ``weights`` is a :class:`~transformer_kit.checkpoints.Weights`.
        probe: a tensor every checkpoint of the family holds (without the prefix), to tell a
            checkpoint of another model apart.
        prefixes: where the base model's tensors may sit (``"model."`` under a task head, ``""``
            for the base model alone), tried in order.
        description: one line shown in listings.
    """

    model_type: str
    to_config: Callable[[dict], dict]
    to_state_dict: Callable[..., dict]
    probe: str
    prefixes: tuple[str, ...] = ("",)
    description: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.model_type, str) or not self.model_type:
            raise ValueError(f"CheckpointFamily.model_type must be a non-empty string, got "
                             f"{self.model_type!r}.")
        for name in ("to_config", "to_state_dict"):
            if not callable(getattr(self, name)):
                raise TypeError(f"CheckpointFamily {self.model_type!r}: {name} must be callable, got "
                                f"{type(getattr(self, name)).__name__}.")
        object.__setattr__(self, "prefixes", tuple(self.prefixes))
