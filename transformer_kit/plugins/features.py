"""Features: what turns a raw signal into the features a frontend reads. Whisper's log-mel
spectrogram, as transformers' ``WhisperFeatureExtractor`` computes it: a centred STFT (reflect
padding, a periodic Hann window), the power of each bin, Slaney-style mel filters, log10 of at
least 1e-10, then clamped to 8 below the signal's maximum and scaled by (x + 4) / 4.

The ONNX lowering writes the STFT as a product: the frames gathered from the padded signal,
windowed, times the cosine and sine bases of a real DFT, so every runtime (Python, the server,
Triton) gets the same features from onnxruntime's matrix product.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor, nn

from transformer_kit.core.graph_writer import GraphWriter

#: Where the slaney mel scale turns logarithmic (Hz), and the mel value there.
_LOG_HZ, _LOG_MEL = 1000.0, 15.0
_LOG_STEP = 27.0 / math.log(6.4)


def _hz_to_mel(hz: np.ndarray) -> np.ndarray:
    hz = np.asarray(hz, dtype=np.float64)
    mel = 3.0 * hz / 200.0
    above = hz >= _LOG_HZ
    return np.where(above, _LOG_MEL + np.log(np.maximum(hz, _LOG_HZ) / _LOG_HZ) * _LOG_STEP, mel)


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    mel = np.asarray(mel, dtype=np.float64)
    hz = 200.0 * mel / 3.0
    above = mel >= _LOG_MEL
    return np.where(above, _LOG_HZ * np.exp((np.maximum(mel, _LOG_MEL) - _LOG_MEL) / _LOG_STEP), hz)


def mel_filters(n_freqs: int, n_mels: int, sampling_rate: int, f_min: float = 0.0,
                f_max: float = 8000.0) -> np.ndarray:
    """Slaney-normalized triangular filters on the slaney mel scale, (n_freqs, n_mels) float64
    (librosa's ``filters.mel(htk=False, norm="slaney")``, transformers' ``mel_filter_bank``)."""
    mels = np.linspace(_hz_to_mel(f_min), _hz_to_mel(f_max), n_mels + 2)
    edges = _mel_to_hz(mels)  # (n_mels + 2,) the filters' corners in Hz
    freqs = np.linspace(0, sampling_rate // 2, n_freqs)
    widths = np.diff(edges)
    slopes = edges[None, :] - freqs[:, None]  # (n_freqs, n_mels + 2)
    down = -slopes[:, :-2] / widths[:-1]
    up = slopes[:, 2:] / widths[1:]
    filters = np.maximum(0.0, np.minimum(down, up))
    return filters * (2.0 / (edges[2:n_mels + 2] - edges[:n_mels]))[None, :]


class LogMelSpectrogram(nn.Module):
    """samples (batch, n_samples) float32 at ``sampling_rate`` -> log-mel features (batch,
    n_mels, n_samples // hop_length), Whisper's.

    Args:
        n_mels: mel bins (80; 128 for large-v3 and its turbo).
        n_fft: the window's length in samples; hop_length: samples between frames.
        sampling_rate: the samples' rate (Hz); the filters span 0 to 8 kHz.
        dynamic_range: how far below each row's maximum the log spectrum is clamped (log10
            units; Whisper's 8).
    """

    def __init__(self, n_mels: int = 80, n_fft: int = 400, hop_length: int = 160,
                 sampling_rate: int = 16000, dynamic_range: float = 8.0) -> None:
        super().__init__()
        for name, value in (("n_mels", n_mels), ("n_fft", n_fft), ("hop_length", hop_length),
                            ("sampling_rate", sampling_rate)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if n_fft < 2 or hop_length > n_fft:
            raise ValueError(f"n_fft ({n_fft}) must be at least 2 and at least hop_length ({hop_length})")
        if not dynamic_range > 0:
            raise ValueError(f"dynamic_range must be positive, got {dynamic_range!r}")
        self.n_mels, self.n_fft, self.hop_length = n_mels, n_fft, hop_length
        self.sampling_rate, self.dynamic_range = sampling_rate, float(dynamic_range)
        n_freqs = n_fft // 2 + 1
        filters = mel_filters(n_freqs, n_mels, sampling_rate)
        self.register_buffer("filters", torch.from_numpy(filters).float(), persistent=False)
        self.register_buffer("window", torch.hann_window(n_fft), persistent=False)
        # The real DFT's bases for the ONNX lowering: bin k of sample n, (n_fft, n_freqs).
        angles = 2 * np.pi * np.outer(np.arange(n_fft), np.arange(n_freqs)) / n_fft
        self.register_buffer("dft_cos", torch.from_numpy(np.cos(angles)).float(), persistent=False)
        self.register_buffer("dft_sin", torch.from_numpy(np.sin(angles)).float(), persistent=False)

    def frames(self, n_samples: int) -> int:
        """How many feature frames ``n_samples`` samples give."""
        return n_samples // self.hop_length

    def forward(self, samples: Tensor) -> Tensor:
        stft = torch.stft(samples.float(), self.n_fft, self.hop_length, window=self.window,
                          center=True, pad_mode="reflect", return_complex=True)
        power = stft[..., :-1].abs() ** 2  # (batch, n_freqs, frames); the last frame dropped
        mel = self.filters.T @ power
        log_spec = torch.clamp(mel, min=1e-10).log10()
        peak = log_spec.amax(dim=(1, 2), keepdim=True)
        return (torch.maximum(log_spec, peak - self.dynamic_range) + 4.0) / 4.0


# -- ONNX ------------------------------------------------------------------------------------------
def log_mel_onnx(g: GraphWriter, log_mel: LogMelSpectrogram, samples):
    """samples (batch, n_samples) float32 -> (batch, n_mels, frames) float32; computed in
    float32 whatever the activations' type (the frontend casts)."""
    half = log_mel.n_fft // 2
    padded = g.op.Pad(samples, [0, half, 0, half], mode="reflect")  # torch.stft's centring
    length = g.op.Shape(samples, start=1, end=2)
    frames = g.op.Div(length, [log_mel.hop_length])  # the centred STFT's frames less the last
    starts = g.op.Mul(g.op.Range(g.constant(np.array(0, np.int64)), g.op.Squeeze(frames, [0]),
                                 g.constant(np.array(1, np.int64))), [log_mel.hop_length])
    offsets = g.constant(np.arange(log_mel.n_fft, dtype=np.int64))
    index = g.op.Add(g.op.Unsqueeze(starts, [1]), g.op.Unsqueeze(offsets, [0]))  # (frames, n_fft)
    windowed = g.op.Mul(g.op.Gather(padded, index, axis=1), g.weight(log_mel, "window", g.FLOAT))
    real = g.op.MatMul(windowed, g.weight(log_mel, "dft_cos", g.FLOAT))  # (batch, frames, n_freqs)
    imag = g.op.MatMul(windowed, g.weight(log_mel, "dft_sin", g.FLOAT))
    power = g.op.Add(g.op.Mul(real, real), g.op.Mul(imag, imag))
    mel = g.op.Transpose(g.op.MatMul(power, g.weight(log_mel, "filters", g.FLOAT)), perm=[0, 2, 1])
    log_spec = g.op.Div(g.op.Log(g.op.Max(mel, g.constant(1e-10, g.FLOAT))),
                        g.constant(math.log(10.0), g.FLOAT))
    peak = g.op.ReduceMax(log_spec, [1, 2], keepdims=1)
    floor = g.op.Sub(peak, g.constant(log_mel.dynamic_range, g.FLOAT))
    scaled = g.op.Div(g.op.Add(g.op.Max(log_spec, floor), g.constant(4.0, g.FLOAT)),
                      g.constant(4.0, g.FLOAT))
    return g.shaped(scaled, ["batch", log_mel.n_mels, "frames"], g.FLOAT)
