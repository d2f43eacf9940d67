"""BART (``BartForConditionalGeneration``): encoder-decoder, learned positions with BART's
offset of 2, ``layernorm_embedding`` (``embedding_norm``), post_norm, the configured activation,
``final_logits_bias`` as the head's bias, generation from ``decoder_start_token_id`` with the
first token forced to ``forced_bos_token_id`` where the config sets it."""

from __future__ import annotations

from transformer_kit import CheckpointFamily, ModelConfig
from transformer_kit.checkpoints import StateDict, Weights, copy_linear, require
from transformer_kit.plugins.families.marian import marian_config, marian_weights

#: BartLearnedPositionalEmbedding's rows before position 0.
POSITION_OFFSET = 2


def bart_config(hf: dict) -> dict:
    require(not hf.get("add_final_layer_norm"), "bart", "add_final_layer_norm (mBART's layout)")
    config = marian_config(hf, "bart")
    forced = hf.get("forced_bos_token_id")
    config.update({
        "max_len": hf["max_position_embeddings"], "embedding_norm": True,
        "positional": {"name": "learned", "offset": POSITION_OFFSET}, "forced_bos_id": forced,
    })
    return config


def bart_weights(hf: dict, w: Weights, cfg: ModelConfig) -> StateDict:
    out = marian_weights(hf, w, cfg)
    for side, ours in (("encoder", "src_embed"), ("decoder", "tgt_embed")):
        out[f"{ours}.positional.table.weight"] = w.get(f"{side}.embed_positions.weight")
        copy_linear(out, f"{ours}.norm", w, f"{side}.layernorm_embedding")
    return out


FAMILY = CheckpointFamily("bart", bart_config, bart_weights, probe="encoder.layernorm_embedding.weight",
                          prefixes=("model.", ""), description="BartForConditionalGeneration")
