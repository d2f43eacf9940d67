"""Marian (``MarianMTModel``): encoder-decoder, sinusoidal positions in the split layout,
scaled embeddings, post_norm, the configured activation, ``final_logits_bias`` as the head's
bias, generation from ``decoder_start_token_id``."""

from __future__ import annotations

from transformer_kit import CheckpointFamily, ModelConfig
from transformer_kit.checkpoints import StateDict, Weights, copy_attention, copy_linear, require
from transformer_kit.plugins.feedforward import feedforward_for_activation


def marian_config(hf: dict, family: str = "marian") -> dict:
    """The config of a Marian-layout checkpoint (also BART's); ``family`` names it in refusals."""
    for a, b in (("encoder_attention_heads", "decoder_attention_heads"),
                 ("encoder_ffn_dim", "decoder_ffn_dim")):
        require(hf.get(a) == hf.get(b), family, f"{a} != {b}")
    require(not hf.get("normalize_before"), family, "normalize_before")
    vocab = hf["vocab_size"]
    decoder_vocab = hf.get("decoder_vocab_size") or vocab
    shared = hf.get("share_encoder_decoder_embeddings", True) and decoder_vocab == vocab
    sizes = {"vocab_size": vocab} if shared else {"src_vocab_size": vocab,
                                                  "tgt_vocab_size": decoder_vocab}
    return {
        "architecture": "encoder_decoder", **sizes, "d_model": hf["d_model"],
        "num_heads": hf["encoder_attention_heads"], "encoder_layers": hf["encoder_layers"],
        "decoder_layers": hf["decoder_layers"], "d_ff": hf["encoder_ffn_dim"],
        "dropout": hf.get("dropout", 0.1), "max_len": hf.get("max_position_embeddings", 512),
        "pad_id": hf["pad_token_id"], "bos_id": hf.get("decoder_start_token_id", hf["pad_token_id"]),
        "eos_id": hf["eos_token_id"], "tie_embeddings": hf.get("tie_word_embeddings", True),
        "scale_embeddings": bool(hf.get("scale_embedding", False)), "attention_bias": True,
        "head_bias": True, "attention": "sdpa",
        "positional": {"name": "sinusoidal", "layout": "split"}, "mask": "causal",
        "block": "post_norm",
        "feedforward": feedforward_for_activation(hf.get("activation_function", "gelu"), family),
        "norm": {"name": "layernorm", "eps": 1e-5},
    }


def marian_weights(hf: dict, w: Weights, cfg: ModelConfig) -> StateDict:
    shared = w.get("shared.weight", "encoder.embed_tokens.weight")
    out: StateDict = {"src_embed.token.weight": shared if cfg.shared_vocab else
                      w.get("encoder.embed_tokens.weight")}
    out["tgt_embed.token.weight"] = shared if cfg.shared_vocab else w.get("decoder.embed_tokens.weight")
    names = ("q_proj", "k_proj", "v_proj", "out_proj")
    for side, count in (("encoder", cfg.n_encoder_layers), ("decoder", cfg.n_decoder_layers)):
        for i in range(count):
            layer = f"{side}.layers.{i}"  # the same path in both models
            copy_attention(out, f"{layer}.self_attention", w, f"{layer}.self_attn", names, True)
            copy_linear(out, f"{layer}.self_norm", w, f"{layer}.self_attn_layer_norm")
            if side == "decoder":
                copy_attention(out, f"{layer}.cross_attention", w, f"{layer}.encoder_attn", names, True)
                copy_linear(out, f"{layer}.cross_norm", w, f"{layer}.encoder_attn_layer_norm")
            copy_linear(out, f"{layer}.feedforward.linear1", w, f"{layer}.fc1")
            copy_linear(out, f"{layer}.feedforward.linear2", w, f"{layer}.fc2")
            copy_linear(out, f"{layer}.ff_norm", w, f"{layer}.final_layer_norm")
    out["head.weight"] = out["tgt_embed.token.weight"] if cfg.tie_embeddings else w.get("lm_head.weight")
    out["head.bias"] = w.get("final_logits_bias").reshape(-1)
    return out


FAMILY = CheckpointFamily("marian", marian_config, marian_weights, probe="encoder.layers.0.fc1.weight",
                          prefixes=("model.", ""), description="MarianMTModel")
