"""Phi-3 (``Phi3ForCausalLM``: Phi-3 mini 4k/128k, Phi-3.5-mini, Phi-4-mini): Llama's layout with
the fused projections split into the kit's (``qkv_proj`` rows [q; k; v] into q, k and v;
``gate_up_proj`` rows [gate; up] into gate and up), partial rotary (``partial_rotary_factor``
-> ``rotary_dim``), LongRoPE (``rope_scaling`` of type ``longrope``; the older names ``su`` and
``yarn`` read as longrope, as transformers reads them), ``sliding_window`` -> the
``sliding_window`` mask (transformers applies it), no biases."""

from __future__ import annotations

import re

from torch import Tensor

from transformer_kit import CheckpointFamily, ModelConfig
from transformer_kit.checkpoints import StateDict, Weights, require
from transformer_kit.plugins.families.llama import llama_config, llama_weights, rotary_spec

#: A Llama-layout name that Phi-3 stores inside a fused projection.
_FUSED = re.compile(r"(.*\.)(self_attn|mlp)\.(q|k|v|gate|up)_proj\.weight")
_FUSED_NAMES = {"self_attn": "qkv_proj", "mlp": "gate_up_proj"}


def _rope(hf: dict) -> tuple[dict, str]:
    """config.json's rotary parameters (rope_parameters, or rope_scaling with rope_theta and
    partial_rotary_factor beside it) as one dict, and the field that holds them."""
    field = "rope_parameters" if hf.get("rope_parameters") else "rope_scaling"
    rope = dict(hf.get(field) or {})
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind in ("su", "yarn"):  # Phi-3's first releases named LongRoPE so
        kind = "longrope"
    require(kind in ("default", "longrope"), "phi3",
            f"{field} of type {kind!r} (Phi-3 uses default or longrope rotary)")
    rope.update(rope_type=kind, type=kind)
    rope.setdefault("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    return rope, field


def phi3_config(hf: dict) -> dict:
    require(hf.get("hidden_act", "silu") == "silu", "phi3",
            f"hidden_act {hf.get('hidden_act')!r} (Phi-3's gated feed-forward is SiLU-gated)")
    rope, field = _rope(hf)
    head_dim = hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]
    fraction = rope["partial_rotary_factor"]
    rotary_dim = int(head_dim * fraction)
    require(rotary_dim > 0 and rotary_dim % 2 == 0, "phi3",
            f"partial_rotary_factor {fraction} (head_dim {head_dim} x it = {rotary_dim}, not a "
            "positive even number)")
    for key in ("short_factor", "long_factor") if rope["rope_type"] == "longrope" else ():
        count = len(rope.get(key) or [])
        require(count == rotary_dim // 2, "phi3", f"{field} {key} of {count} values (rotary_dim "
                f"{rotary_dim} needs {rotary_dim // 2}, one per rotated pair)")
    window = hf.get("sliding_window")
    require(window is None or (isinstance(window, int) and window > 0), "phi3",
            f"sliding_window {window!r} (a positive integer or null)")
    hf = {**hf, field: rope, "attention_bias": False, "mlp_bias": False}
    config = llama_config(hf, "phi3")
    config["positional"] = rotary_spec(hf, "phi3", rotary_dim if rotary_dim < head_dim else None)
    if window is not None:
        config["mask"] = {"name": "sliding_window", "window": window}
    return config


class _Unfused:
    """Phi-3's weights read by Llama's names: q, k and v rows of ``qkv_proj``, gate and up rows
    of ``gate_up_proj`` (slices, which a streamed checkpoint records without reading)."""

    def __init__(self, weights: Weights, cfg: ModelConfig) -> None:
        self.weights = weights
        q, kv = cfg.num_heads * cfg.attention_head_dim, cfg.kv_heads * cfg.attention_head_dim
        self.rows = {"q": (0, q), "k": (q, q + kv), "v": (q + kv, q + 2 * kv),
                     "gate": (0, cfg.d_ff), "up": (cfg.d_ff, 2 * cfg.d_ff)}

    def get(self, name: str) -> Tensor:
        """The tensor ``name`` (a Llama-layout name), out of its fused projection where fused."""
        match = _FUSED.fullmatch(name)
        if match is None:
            return self.weights.get(name)
        layer, part, which = match.groups()
        fused = self.weights.get(f"{layer}{part}.{_FUSED_NAMES[part]}.weight")
        start, stop = self.rows[which]
        require(fused.shape[0] >= stop, "phi3",
                f"{layer}{part} fused weights of {fused.shape[0]} rows (the config needs {stop})")
        return fused[start:stop]


def phi3_weights(hf: dict, w: Weights, cfg: ModelConfig) -> StateDict:
    return llama_weights(hf, _Unfused(w, cfg), cfg)  # type: ignore[arg-type]


FAMILY = CheckpointFamily("phi3", phi3_config, phi3_weights, probe="embed_tokens.weight",
                          prefixes=("model.", ""), description="Phi3ForCausalLM")
