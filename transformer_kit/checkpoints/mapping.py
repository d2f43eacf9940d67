"""Helpers for checkpoint families: copying a checkpoint's tensors under the kit's names.

The names written here belong to the core (``MultiHeadAttention``'s ``q_proj``, ``k_proj``,
``v_proj``, ``o_proj``); the names of components (``self_norm``, ``feedforward.linear1``, ...)
are written by the family modules next to the components that define them.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from transformer_kit.checkpoints.reader import Weights
from transformer_kit.core.errors import CheckpointError

StateDict = dict[str, Tensor]
ATTENTION_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")


def require(condition: bool, model_type: str, what: str) -> None:
    """Refuse a checkpoint variant the family does not map (never load it approximately)."""
    if not condition:
        raise CheckpointError(f"{model_type} checkpoint with {what} is not supported.")


def put_linear(out: StateDict, ours: str, weight: Tensor, bias: Tensor | None = None) -> None:
    """``out[ours.weight] = weight`` (and ``.bias``): weight (out_features, in_features)."""
    out[f"{ours}.weight"] = weight
    if bias is not None:
        out[f"{ours}.bias"] = bias


def copy_linear(out: StateDict, ours: str, weights: Weights, theirs: str, bias: bool = True) -> None:
    """Copy a layer's weight (and bias) whose layout already matches ours."""
    put_linear(out, ours, weights.get(f"{theirs}.weight"),
               weights.get(f"{theirs}.bias") if bias else None)


def copy_attention(out: StateDict, ours: str, weights: Weights, theirs: str,
                   names: tuple[str, str, str, str], bias: bool, out_bias: bool | None = None) -> None:
    """Copy the q, k, v and output projections, named ``names`` in the checkpoint, into the
    ``MultiHeadAttention`` at ``ours`` (``out_bias``: the output projection's, None = ``bias``)."""
    biases = (bias, bias, bias, bias if out_bias is None else out_bias)
    for our_name, their_name, has_bias in zip(ATTENTION_PROJECTIONS, names, biases, strict=True):
        copy_linear(out, f"{ours}.{our_name}", weights, f"{theirs}.{their_name}", has_bias)


def first_id(ids: Any) -> Any:
    """A special id that config.json may give as a list (Llama 3's eos): its first entry."""
    return ids[0] if isinstance(ids, list) else ids
