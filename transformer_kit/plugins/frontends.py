"""Frontends: what turns an encoder-decoder's source features into the encoder's embeddings,
in the slot a token embedding takes for text. Whisper's audio stem: two Conv1d, each followed by
GELU, the second at stride 2 (30 s of log-mel frames, 3000, become 1500 embeddings).

Each frontend's ONNX lowering follows its forward op for op.
"""

from __future__ import annotations

from torch import Tensor, nn

from transformer_kit.core.graph_writer import GraphWriter
from transformer_kit.core.layer_lowerings import gelu_onnx


class AudioConvStem(nn.Module):
    """features (batch, in_channels, frames) -> (batch, ceil(frames / stride), d_model):
    ``gelu(conv2(gelu(conv1(x))))``, both kernels ``kernel_size`` wide and padded to keep the
    frames, ``conv2`` at ``stride`` (Whisper's encoder stem).

    Args:
        d_model: the encoder's width (each conv's output channels).
        in_channels: the features' channels (80 or 128 mel bins).
        kernel_size: each conv's width (odd); stride: the second conv's.
    """

    def __init__(self, d_model: int, in_channels: int = 80, kernel_size: int = 3, stride: int = 2) -> None:
        super().__init__()
        for name, value in (("in_channels", in_channels), ("kernel_size", kernel_size), ("stride", stride)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if kernel_size % 2 == 0:
            raise ValueError(f"kernel_size must be odd (padded by (kernel_size - 1) / 2 on each "
                             f"side to keep the frames), got {kernel_size}")
        self.in_channels, self.stride = in_channels, stride
        pad = (kernel_size - 1) // 2
        self.conv1 = nn.Conv1d(in_channels, d_model, kernel_size, padding=pad)
        self.conv2 = nn.Conv1d(d_model, d_model, kernel_size, stride=stride, padding=pad)

    def output_length(self, frames: int) -> int:
        """How many embeddings ``frames`` feature frames give."""
        return (frames - 1) // self.stride + 1

    def forward(self, features: Tensor) -> Tensor:
        x = nn.functional.gelu(self.conv1(features))
        x = nn.functional.gelu(self.conv2(x))
        return x.transpose(1, 2)


# -- ONNX ------------------------------------------------------------------------------------------
def _conv_onnx(g: GraphWriter, conv: nn.Conv1d, x):
    return g.op.Conv(x, g.weight(conv, "weight"), g.weight(conv, "bias"),
                     kernel_shape=list(conv.kernel_size), pads=[conv.padding[0]] * 2,
                     strides=list(conv.stride))


def audio_conv_onnx(g: GraphWriter, stem: AudioConvStem, features):
    """features (batch, in_channels, frames) -> (batch, frames', d_model)."""
    x = gelu_onnx(g, _conv_onnx(g, stem.conv1, features))
    x = gelu_onnx(g, _conv_onnx(g, stem.conv2, x))
    return g.shaped(g.op.Transpose(x, perm=[0, 2, 1]), ["batch", "frames", stem.conv2.out_channels],
                    g.float_type)


__all__ = ["AudioConvStem", "audio_conv_onnx"]
