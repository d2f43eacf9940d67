"""Whisper (``WhisperForConditionalGeneration``): speech in, text out. The source is 16 kHz
audio: its log-mel spectrogram (``features``: log_mel, 80 or 128 bins) through the audio stem
(``frontend``: two Conv1d + GELU) plus fixed sinusoids (``encoder_positional``: the checkpoint's
stored table); a pre-norm encoder and decoder with cross attention, GELU feed-forwards, learned
decoder positions, the head tied to the token embedding. Tiny to large-v3 and large-v3-turbo;
distil-whisper's short decoders are the same layout.

Whisper's k projections have no bias; they get a zero one (the kit's attention biases q, k and
v alike), which changes no value."""

from __future__ import annotations

import torch

from transformer_kit import CheckpointFamily, ModelConfig
from transformer_kit.checkpoints import StateDict, Weights, copy_linear, put_linear, require
from transformer_kit.plugins.feedforward import feedforward_for_activation

#: Whisper's timestamp tokens: <|0.00|> to <|30.00|>, the last ids of every vocabulary.
TIMESTAMPS = 1501


def speech_settings(hf: dict) -> dict:
    """The ``speech`` config of a Whisper checkpoint: its generation_config.json's ids where it
    has them, else Whisper's layout (the special tokens just before the timestamps, which end
    the vocabulary), as transformers derives them."""
    vocab = hf["vocab_size"]
    no_timestamps = hf.get("no_timestamps_token_id", vocab - TIMESTAMPS - 1)
    tasks = hf.get("task_to_id") or {}
    layers, heads = hf["decoder_layers"], hf["decoder_attention_heads"]
    heads_of_alignment = hf.get("alignment_heads") or [  # the last half of the layers' heads
        [layer, head] for layer in range(layers // 2, layers) for head in range(heads)]
    return {
        "start_of_transcript": hf["decoder_start_token_id"], "end_of_text": hf["eos_token_id"],
        "transcribe": tasks.get("transcribe", no_timestamps - 4),
        "translate": tasks.get("translate", no_timestamps - 5),
        "start_of_prev": hf.get("prev_sot_token_id", no_timestamps - 2),
        "no_speech": no_timestamps - 1, "no_timestamps": no_timestamps,
        "timestamp_begin": no_timestamps + 1,
        "multilingual": bool(hf.get("is_multilingual", vocab >= 51865)),
        "languages": {code.strip("<|>"): i for code, i in (hf.get("lang_to_id") or {}).items()},
        "suppress_tokens": list(hf.get("suppress_tokens") or []),
        "begin_suppress_tokens": list(hf.get("begin_suppress_tokens") or []),
        "alignment_heads": [list(pair) for pair in heads_of_alignment],
        "max_initial_timestamp_index": hf.get("max_initial_timestamp_index", 50),
        "median_filter_width": hf.get("median_filter_width", 7),
    }


def whisper_config(hf: dict) -> dict:
    for a, b in (("encoder_attention_heads", "decoder_attention_heads"),
                 ("encoder_ffn_dim", "decoder_ffn_dim")):
        require(hf.get(a) == hf.get(b), "whisper", f"{a} != {b}")
    require(not hf.get("scale_embedding"), "whisper", "scale_embedding")
    mels = hf.get("num_mel_bins", 80)
    return {
        "architecture": "encoder_decoder", "vocab_size": hf["vocab_size"], "d_model": hf["d_model"],
        "num_heads": hf["encoder_attention_heads"], "encoder_layers": hf["encoder_layers"],
        "decoder_layers": hf["decoder_layers"], "d_ff": hf["encoder_ffn_dim"],
        "dropout": hf.get("dropout", 0.0), "max_len": hf.get("max_target_positions", 448),
        "pad_id": hf["pad_token_id"], "bos_id": hf["decoder_start_token_id"],
        "eos_id": hf["eos_token_id"], "tie_embeddings": True, "scale_embeddings": False,
        "attention_bias": True, "head_bias": False, "attention": "sdpa",
        "features": {"name": "log_mel", "n_mels": mels},
        "frontend": {"name": "audio_conv", "in_channels": mels},
        "encoder_positional": {"name": "sinusoidal_table",
                               "length": hf.get("max_source_positions", 1500)},
        "positional": "learned", "mask": "causal", "block": "pre_norm",
        "feedforward": feedforward_for_activation(hf.get("activation_function", "gelu"), "whisper"),
        "norm": {"name": "layernorm", "eps": 1e-5},
        "speech": speech_settings(hf),
    }


def _copy_attention(out: StateDict, ours: str, w: Weights, theirs: str, d_model: int) -> None:
    for our_name, their_name in (("q_proj", "q_proj"), ("v_proj", "v_proj"), ("o_proj", "out_proj")):
        copy_linear(out, f"{ours}.{our_name}", w, f"{theirs}.{their_name}")
    put_linear(out, f"{ours}.k_proj", w.get(f"{theirs}.k_proj.weight"), torch.zeros(d_model))


def whisper_weights(hf: dict, w: Weights, cfg: ModelConfig) -> StateDict:
    d = cfg.d_model
    out: StateDict = {"tgt_embed.token.weight": w.get("decoder.embed_tokens.weight"),
                      "tgt_embed.positional.table.weight": w.get("decoder.embed_positions.weight"),
                      "src_embed.positional.table.weight": w.get("encoder.embed_positions.weight")}
    for conv in ("conv1", "conv2"):
        copy_linear(out, f"src_embed.frontend.{conv}", w, f"encoder.{conv}")
    for side, count in (("encoder", cfg.n_encoder_layers), ("decoder", cfg.n_decoder_layers)):
        for i in range(count):
            layer = f"{side}.layers.{i}"  # the same path in both models
            _copy_attention(out, f"{layer}.self_attention", w, f"{layer}.self_attn", d)
            copy_linear(out, f"{layer}.self_norm", w, f"{layer}.self_attn_layer_norm")
            if side == "decoder":
                _copy_attention(out, f"{layer}.cross_attention", w, f"{layer}.encoder_attn", d)
                copy_linear(out, f"{layer}.cross_norm", w, f"{layer}.encoder_attn_layer_norm")
            copy_linear(out, f"{layer}.feedforward.linear1", w, f"{layer}.fc1")
            copy_linear(out, f"{layer}.feedforward.linear2", w, f"{layer}.fc2")
            copy_linear(out, f"{layer}.ff_norm", w, f"{layer}.final_layer_norm")
        copy_linear(out, f"{side}.final_norm", w, f"{side}.layer_norm")
    out["head.weight"] = out["tgt_embed.token.weight"]
    return out


FAMILY = CheckpointFamily("whisper", whisper_config, whisper_weights,
                          probe="encoder.conv1.weight", prefixes=("model.", ""),
                          description="WhisperForConditionalGeneration")
