"""Gemma 3's language model (``Gemma3ForCausalLM``, model_type ``gemma3_text``): Gemma 2's layout
with each query and key head normalised by a (1 + weight) RMSNorm before rotary
(``qk_norm: per_head_rmsnorm``), sliding-window layers with a rotary base of their own
(``rope_parameters.sliding_attention`` or ``rope_local_base_freq``; the global layers' may be
scaled), logits soft-capped when ``final_logit_softcapping`` says so. ``attn_logit_softcapping``
is ignored, as transformers' Gemma 3 ignores it (its attention never passes it on; Gemma 3's
checkpoints leave it null). Bidirectional attention is refused."""

from __future__ import annotations

from transformer_kit import CheckpointFamily
from transformer_kit.checkpoints import require
from transformer_kit.plugins.families._layers import FULL, SLIDING
from transformer_kit.plugins.families.gemma import gemma_config
from transformer_kit.plugins.families.gemma2 import attention_spec, gemma2_weights, sliding_variants
from transformer_kit.plugins.families.llama import rotary_spec


def rope_by_layer_type(hf: dict) -> tuple[dict, dict]:
    """The rotary parameters of the global and of the sliding layers, from transformers 5's
    ``rope_parameters`` by layer type or the older ``rope_theta``/``rope_scaling`` and
    ``rope_local_base_freq``."""
    nested = hf.get("rope_parameters") or {}
    if FULL in nested or SLIDING in nested:
        return nested.get(FULL) or {}, nested.get(SLIDING) or {}
    full = {**(hf.get("rope_scaling") or {}), "rope_theta": hf.get("rope_theta", 1_000_000.0)}
    return full, {"rope_type": "default", "rope_theta": hf.get("rope_local_base_freq", 10_000.0)}


def gemma3_text_config(hf: dict, family: str = "gemma3_text") -> dict:
    require(not hf.get("use_bidirectional_attention"), family,
            "use_bidirectional_attention true (the kit maps the causal language model)")
    full, sliding = rope_by_layer_type(hf)
    plain = {key: value for key, value in hf.items()
             if key not in ("rope_parameters", "rope_scaling", "rope_theta")}
    config = gemma_config(plain, family)
    config.update(
        block="sandwich", attention=attention_spec({**hf, "attn_logit_softcapping": None}),
        positional=rotary_spec({**plain, "rope_parameters": {"rope_type": "default", **full}}, family),
        qk_norm={"name": "per_head_rmsnorm", "eps": hf.get("rms_norm_eps", 1e-6), "unit_offset": True},
        **sliding_variants(hf, family, default_every=hf.get("sliding_window_pattern", 6),
                           sliding={"positional": rotary_spec(
                               {**plain, "rope_parameters": {"rope_type": "default", **sliding}},
                               family)}))
    if hf.get("final_logit_softcapping") is not None:
        config["logit_softcap"] = float(hf["final_logit_softcapping"])
    return config


#: Gemma 2's weights; the per-head q and k norms are read as the config has them.
FAMILY = CheckpointFamily("gemma3_text", gemma3_text_config, gemma2_weights,
                          probe="embed_tokens.weight", prefixes=("model.", ""),
                          description="Gemma3ForCausalLM")
