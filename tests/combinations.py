"""Built-in component combinations shared by the core tests."""

from __future__ import annotations

import itertools

ATTENTION = ["matmul", "einsum", "sdpa"]
POSITIONAL = ["sinusoidal", "learned", "rotary", "alibi", "relative_bias", "none"]
CAUSAL_MASKS = ["causal", {"name": "sliding_window", "window": 3}]
BLOCKS = ["post_norm", "pre_norm", "parallel", "post_sublayer_norm", "sandwich"]
FEEDFORWARD = ["relu", "gelu", "silu", "swiglu", "geglu"]
NORMS = ["layernorm", "rmsnorm"]
QK_NORMS = [None, "per_head_rmsnorm", "rmsnorm"]  # optional; None: the default (none)
POOLINGS = ["cls", "mean", "max", "mean_sqrt_len", "weightedmean", "lasttoken"]  # encoders, optional


def tiny_config(architecture: str, **overrides) -> dict:
    """A model small enough to build and run in milliseconds; grouped KV heads (4 -> 2)."""
    config = {
        "architecture": architecture, "vocab_size": 37, "d_model": 16, "num_heads": 4,
        "num_kv_heads": 2, "num_layers": 2, "d_ff": 24, "dropout": 0.0, "max_len": 64,
        "tie_embeddings": False,
    }
    config.update(overrides)
    return config


def all_generating_configs() -> list[tuple[str, dict]]:
    """The built-in combinations for the two architectures that generate: every combination of
    what a cache step touches (architecture, attention kernel, positions, mask, q/k norm), each
    with one of the position-wise parts (block, feed-forward, norm) in turn.

    The position-wise parts see a token at a time, so a cache cannot make them differ; drawn in
    turn, every triple of them appears and every pair of any two factors' values does (216
    cases, where the whole product is 3,600).
    """
    position_wise = list(itertools.product(BLOCKS, FEEDFORWARD, NORMS))
    cases = []
    for i, (arch, attention, positional, mask, qk_norm) in enumerate(itertools.product(
        ["decoder", "encoder_decoder"], ATTENTION, POSITIONAL, CAUSAL_MASKS, QK_NORMS
    )):
        block, ff, norm = position_wise[i % len(position_wise)]
        mask_name = mask if isinstance(mask, str) else mask["name"]
        case_id = "-".join([arch, attention, positional, mask_name, block, ff, norm, f"qk-{qk_norm}"])
        cases.append((case_id, tiny_config(arch, attention=attention, positional=positional,
                                           mask=mask, block=block, feedforward=ff, norm=norm,
                                           qk_norm=qk_norm)))
    return cases
