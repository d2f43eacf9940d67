"""The built-in plugin ``builtin``: the model's components, each with its ONNX lowering, and the
checkpoint families, contributed through the same hooks as any third-party plugin (needs torch)."""

from __future__ import annotations

from transformer_kit import CheckpointFamily, Component, Lowering, hookimpl
from transformer_kit.core.layer_lowerings import layer_norm_onnx
from transformer_kit.plugins.attention import (
    EinsumAttention,
    MatmulAttention,
    SdpaAttention,
    attention_onnx,
)
from transformer_kit.plugins.blocks import (
    ParallelBlock,
    PostNormBlock,
    PostSublayerNormBlock,
    PreNormBlock,
    SandwichBlock,
    parallel_onnx,
    post_norm_onnx,
    post_sublayer_norm_onnx,
    pre_norm_onnx,
    sandwich_onnx,
)
from transformer_kit.plugins.families import builtin_families
from transformer_kit.plugins.features import LogMelSpectrogram, log_mel_onnx
from transformer_kit.plugins.feedforward import (
    GeGLU,
    SwiGLU,
    feedforward_onnx,
    gated_onnx,
    gelu_feedforward,
    relu_feedforward,
    silu_feedforward,
)
from transformer_kit.plugins.frontends import AudioConvStem, audio_conv_onnx
from transformer_kit.plugins.masks import (
    CausalMask,
    NoMask,
    SlidingWindowMask,
    causal_onnx,
    no_mask_onnx,
    sliding_window_onnx,
)
from transformer_kit.plugins.mixture_of_experts import MixtureOfExperts, moe_onnx
from transformer_kit.plugins.norms import (
    QKNorm,
    layer_norm,
    per_head_rms_norm,
    projection_rms_norm,
    qk_norm_onnx,
    rms_norm,
    rms_norm_onnx,
)
from transformer_kit.plugins.pooling import (
    ClsPooling,
    LastTokenPooling,
    MaxPooling,
    MeanPooling,
    WeightedMeanPooling,
    cls_onnx,
    last_token_onnx,
    max_onnx,
    mean_onnx,
    mean_sqrt_len_pooling,
    weighted_mean_onnx,
)
from transformer_kit.plugins.positional import (
    ALiBiPositions,
    LearnedPositions,
    NoPositions,
    RelativePositionBias,
    RotaryPositions,
    SinusoidalPositions,
    SinusoidalTable,
    alibi_onnx,
    learned_onnx,
    no_positions_onnx,
    relative_bias_onnx,
    rotary_onnx,
    sinusoidal_onnx,
)

__all__ = [
    "ALiBiPositions",
    "AudioConvStem",
    "CausalMask",
    "ClsPooling",
    "EinsumAttention",
    "GeGLU",
    "LastTokenPooling",
    "LearnedPositions",
    "LogMelSpectrogram",
    "MatmulAttention",
    "MaxPooling",
    "MeanPooling",
    "MixtureOfExperts",
    "NoMask",
    "NoPositions",
    "ParallelBlock",
    "PostNormBlock",
    "PostSublayerNormBlock",
    "PreNormBlock",
    "QKNorm",
    "RelativePositionBias",
    "RotaryPositions",
    "SandwichBlock",
    "SdpaAttention",
    "SinusoidalPositions",
    "SinusoidalTable",
    "SlidingWindowMask",
    "SwiGLU",
    "WeightedMeanPooling",
    "gelu_feedforward",
    "layer_norm",
    "mean_sqrt_len_pooling",
    "per_head_rms_norm",
    "projection_rms_norm",
    "relu_feedforward",
    "rms_norm",
    "silu_feedforward",
    "transformer_kit_checkpoint_families",
    "transformer_kit_components",
]

_BIAS = frozenset({"score_bias"})
_CAUSAL = frozenset({"causal"})


@hookimpl
def transformer_kit_components() -> list[Component]:
    return [
        Component("attention", "matmul", MatmulAttention, provides=_BIAS,
                  lowering=Lowering(forward=attention_onnx),
                  description="softmax(q k^T / sqrt(d)) v by matrix products (the paper's formula)"),
        Component("attention", "einsum", EinsumAttention, provides=_BIAS,
                  lowering=Lowering(forward=attention_onnx),
                  description="the same formula written with einsum on (batch, len, heads, dim)"),
        Component("attention", "sdpa", SdpaAttention, provides=_BIAS, lowerings={"attention"},
                  lowering=Lowering(forward=attention_onnx),
                  description="torch scaled_dot_product_attention (fused; one ONNX Attention op)"),
        Component("positional", "sinusoidal", SinusoidalPositions,
                  lowering=Lowering(embed=sinusoidal_onnx),
                  description="fixed sin/cos added to embeddings (the paper), any length"),
        Component("positional", "learned", LearnedPositions,
                  lowering=Lowering(embed=learned_onnx),
                  description="a trained table of max_len positions"),
        Component("positional", "sinusoidal_table", SinusoidalTable,
                  lowering=Lowering(embed=learned_onnx),
                  description="Whisper's encoder sinusoids as a fixed table of `length` rows "
                  "(a checkpoint's stored values read as they are)"),
        Component("positional", "rotary", RotaryPositions, lowerings={"rotary"},
                  lowering=Lowering(rotate=rotary_onnx),
                  description="rotates q and k by position (RoFormer, Llama; one ONNX RotaryEmbedding op)"),
        Component("positional", "relative_bias", RelativePositionBias, requires=_BIAS,
                  lowering=Lowering(score_bias=relative_bias_onnx),
                  description="T5's learned bias per bucket of key - query distance on the scores "
                  "(bidirectional in an encoder, causal in a decoder)"),
        Component("positional", "alibi", ALiBiPositions, requires=_BIAS,
                  lowering=Lowering(score_bias=alibi_onnx),
                  description="linear distance bias on the scores (ALiBi)"),
        Component("positional", "none", NoPositions, lowering=Lowering(embed=no_positions_onnx),
                  description="no position information"),
        Component("mask", "causal", CausalMask, provides=_CAUSAL, lowerings={"causal"},
                  lowering=Lowering(forward=causal_onnx),
                  description="look-ahead: each position sees itself and earlier ones"),
        Component("mask", "sliding_window", SlidingWindowMask, provides=_CAUSAL, lowerings={"causal"},
                  lowering=Lowering(forward=sliding_window_onnx),
                  description="causal, limited to the last `window` positions"),
        Component("mask", "none", NoMask, lowering=Lowering(forward=no_mask_onnx),
                  description="no restriction besides padding"),
        Component("block", "post_norm", PostNormBlock,
                  lowering=Lowering(forward=post_norm_onnx),
                  description="Add & Norm after each sub-layer (the paper)"),
        Component("block", "pre_norm", PreNormBlock,
                  lowering=Lowering(forward=pre_norm_onnx),
                  description="norm before each sub-layer, final norm after the stack"),
        Component("block", "parallel", ParallelBlock,
                  lowering=Lowering(forward=parallel_onnx),
                  description="attention and feed-forward both read the block's input (GPT-NeoX)"),
        Component("block", "post_sublayer_norm", PostSublayerNormBlock,
                  lowering=Lowering(forward=post_sublayer_norm_onnx),
                  description="x + norm(sublayer(x)): the norm on each sub-layer's output (OLMo2)"),
        Component("block", "sandwich", SandwichBlock,
                  lowering=Lowering(forward=sandwich_onnx),
                  description="x + norm(sublayer(norm(x))): norms before and after (Gemma 2, 3)"),
        Component("feedforward", "relu", relu_feedforward, lowering=Lowering(forward=feedforward_onnx),
                  description="Linear-ReLU-Linear (the paper)"),
        Component("feedforward", "gelu", gelu_feedforward,
                  lowering=Lowering(forward=feedforward_onnx),
                  description="Linear-GELU-Linear (approximate: none | tanh)"),
        Component("feedforward", "silu", silu_feedforward,
                  lowering=Lowering(forward=feedforward_onnx),
                  description="Linear-SiLU-Linear (swish; Marian)"),
        Component("feedforward", "swiglu", SwiGLU, lowerings={"gate_up"},
                  lowering=Lowering(forward=gated_onnx),
                  description="SiLU-gated linear unit (Llama; gate and up one product in ONNX)"),
        Component("feedforward", "geglu", GeGLU, lowerings={"gate_up"},
                  lowering=Lowering(forward=gated_onnx),
                  description="GELU-gated linear unit (T5 v1.1, Flan-T5 gated-gelu; approximate: "
                  "tanh | none)"),
        Component("feedforward", "moe", MixtureOfExperts,
                  lowering=Lowering(forward=moe_onnx), export_refusal=MixtureOfExperts.refusal,
                  description="mixture of experts: top-k routed gated experts (Mixtral, Qwen-MoE, "
                  "OLMoE), an optional shared expert; ONNX: onnxruntime's fused MoE op (softmax "
                  "routers, swiglu experts)"),
        Component("norm", "layernorm", layer_norm, lowering=Lowering(forward=layer_norm_onnx),
                  description="LayerNorm (the paper)"),
        Component("norm", "rmsnorm", rms_norm, lowering=Lowering(forward=rms_norm_onnx),
                  description="RMSNorm (Llama)"),
        Component("qk_norm", "per_head_rmsnorm", per_head_rms_norm,
                  lowering=Lowering(forward=qk_norm_onnx),
                  description="RMSNorm of each query and key head before rotary, weights shared "
                  "by the heads (Qwen3, Gemma 3)"),
        Component("qk_norm", "rmsnorm", projection_rms_norm,
                  lowering=Lowering(forward=qk_norm_onnx),
                  description="RMSNorm of the whole q and k projections before rotary (OLMo2)"),
        *_POOLINGS,
        Component("frontend", "audio_conv", AudioConvStem,
                  lowering=Lowering(forward=audio_conv_onnx),
                  description="Whisper's audio stem: features (batch, in_channels, frames) -> two "
                  "Conv1d + GELU, the second at stride 2 -> (batch, frames / 2, d_model)"),
        Component("features", "log_mel", LogMelSpectrogram,
                  lowering=Lowering(forward=log_mel_onnx),
                  description="Whisper's log-mel spectrogram of 16 kHz samples (n_mels 80 or "
                  "128), as transformers' WhisperFeatureExtractor; ONNX: the STFT as a product"),
    ]


_POOLINGS = [
    Component("pooling", "cls", ClsPooling, lowering=Lowering(forward=cls_onnx),
              description="the first token's hidden state ([CLS])"),
    Component("pooling", "mean", MeanPooling, lowering=Lowering(forward=mean_onnx),
              description="the mean over real tokens"),
    Component("pooling", "max", MaxPooling, lowering=Lowering(forward=max_onnx),
              description="the feature-wise maximum over real tokens"),
    Component("pooling", "mean_sqrt_len", mean_sqrt_len_pooling,
              lowering=Lowering(forward=mean_onnx),
              description="the sum over real tokens / sqrt(their count)"),
    Component("pooling", "weightedmean", WeightedMeanPooling,
              lowering=Lowering(forward=weighted_mean_onnx),
              description="the mean weighted by position (later tokens weigh more; SGPT)"),
    Component("pooling", "lasttoken", LastTokenPooling,
              lowering=Lowering(forward=last_token_onnx),
              description="the last real token's hidden state (decoder-style embedders)"),
]


@hookimpl
def transformer_kit_checkpoint_families() -> list[CheckpointFamily]:
    return builtin_families()
