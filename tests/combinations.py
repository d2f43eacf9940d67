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
    """Every built-in combination for the two architectures that generate, each with one of the
    q/k norms in turn (not multiplied by them)."""
    cases = []
    for i, (arch, attention, positional, mask, block, ff, norm) in enumerate(itertools.product(
        ["decoder", "encoder_decoder"], ATTENTION, POSITIONAL, CAUSAL_MASKS, BLOCKS, FEEDFORWARD, NORMS
    )):
        mask_name = mask if isinstance(mask, str) else mask["name"]
        qk_norm = QK_NORMS[i % len(QK_NORMS)]
        case_id = "-".join([arch, attention, positional, mask_name, block, ff, norm, f"qk-{qk_norm}"])
        cases.append((case_id, tiny_config(arch, attention=attention, positional=positional,
                                           mask=mask, block=block, feedforward=ff, norm=norm,
                                           qk_norm=qk_norm)))
    return cases
