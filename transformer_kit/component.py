"""What a plugin contributes: a named factory of one kind, with capability metadata."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: The kinds of component a model is assembled from.
KINDS: tuple[str, ...] = ("attention", "positional", "mask", "block", "feedforward", "norm")

_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.\-]*$")


@dataclass(frozen=True)
class Component:
    """One named implementation of a kind.

    Args:
        kind: one of :data:`KINDS`.
        name: the name a config uses, unique within its kind.
        factory: called with the model's sizes and the config's params; returns the component.
            The keyword arguments each kind receives are listed in ``docs`` of the core
            interfaces (:mod:`transformer_kit.interfaces`).
        description: one line shown in listings.
        exportable: False when the component cannot be exported to ONNX.
        supports_cache: False when cached decoding would not give the uncached result.
        provides: capabilities this component offers to others (e.g. ``"score_bias"`` for an
            attention kernel that accepts an additive bias, ``"causal"`` for a causal mask).
        requires: capabilities it needs from the other components of the same model.
    """

    kind: str
    name: str
    factory: Callable[..., Any]
    description: str = ""
    exportable: bool = True
    supports_cache: bool = True
    provides: frozenset[str] = field(default_factory=frozenset)
    requires: frozenset[str] = field(default_factory=frozenset)

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
        object.__setattr__(self, "provides", frozenset(self.provides))
        object.__setattr__(self, "requires", frozenset(self.requires))
