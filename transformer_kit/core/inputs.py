"""Checks on model inputs, done before any tensor work so errors say what was given."""

from __future__ import annotations

import torch
from torch import Tensor

from transformer_kit.core.errors import InputError
from transformer_kit.core.id_checks import check_id_array, check_positions

__all__ = ["check_features", "check_positions", "check_samples", "check_token_ids", "tracing"]


def tracing() -> bool:
    """True while torch.export / dynamo / jit trace the model (data checks are skipped then)."""
    return torch.compiler.is_compiling() or torch.jit.is_tracing()


def check_token_ids(ids: object, vocab_size: int, name: str = "input_ids") -> Tensor:
    """Refuse ids that are not a (batch, len) integer tensor with values in [0, vocab_size)."""
    if not isinstance(ids, Tensor):
        raise InputError(
            f"{name} must be a torch.Tensor of token ids, got {type(ids).__name__}; "
            "wrap it with torch.tensor(..., dtype=torch.long)."
        )
    if tracing():
        return ids
    is_integer = not (ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool)
    check_id_array(name, is_integer, ids.dtype, ids.shape,
                   lambda: (int(ids.min()), int(ids.max())), vocab_size)
    return ids


def check_features(features: object, frontend: torch.nn.Module) -> Tensor:
    """Refuse features that are not a finite (batch, channels, frames) float tensor with the
    frontend's ``in_channels``."""
    if not isinstance(features, Tensor) or not features.dtype.is_floating_point:
        kind = type(features).__name__ if not isinstance(features, Tensor) else f"{features.dtype} tensor"
        raise InputError(f"This model's source is features (a float tensor of shape (batch, "
                         f"channels, frames)), got a {kind}; for audio, make them with "
                         "model.audio_features(samples).")
    if tracing():
        return features
    channels = getattr(frontend, "in_channels", None)
    if features.dim() != 3 or (channels is not None and features.shape[1] != channels):
        raise InputError(f"features must be (batch, {channels or 'channels'}, frames), got shape "
                         f"{tuple(features.shape)}.")
    if not bool(torch.isfinite(features).all()):
        raise InputError("features hold NaN or infinite values; give finite features.")
    return features


def check_samples(samples: object) -> Tensor:
    """Refuse a signal that is not a finite (batch, n_samples) or (n_samples,) float tensor of
    at least one sample; a (n_samples,) one comes back as (1, n_samples)."""
    if not isinstance(samples, Tensor) or not samples.dtype.is_floating_point:
        kind = type(samples).__name__ if not isinstance(samples, Tensor) else f"{samples.dtype} tensor"
        raise InputError(f"samples must be a float tensor of shape (batch, n_samples) (16 kHz audio), "
                         f"got a {kind}; for a file, read it with core.speech.load_audio.")
    if tracing():
        return samples
    if samples.dim() == 1:
        samples = samples[None]
    if samples.dim() != 2 or samples.shape[1] == 0:
        raise InputError(f"samples must be (batch, n_samples), n_samples >= 1; got shape "
                         f"{tuple(samples.shape)}.")
    if not bool(torch.isfinite(samples).all()):
        raise InputError("samples hold NaN or infinite values; give finite samples.")
    return samples
