"""Token timestamps from cross attention: the alignment heads' weights normalised, smoothed by a
median filter and averaged, and a monotonic path through them by dynamic time warping, each
token timed by the frame where the path first reaches it; transformers'
``WhisperGenerationMixin._extract_token_timestamps`` (and openai-whisper's ``find_alignment``),
on numpy.

Shapes: weights (heads, tokens, frames) for one window's decoded tokens; the encoder's frames
are 20 ms each (two feature frames).
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


def median_filter(x: np.ndarray, width: int) -> np.ndarray:
    """The median over ``width`` (odd) neighbours along the last axis, the edges mirrored
    (reflect padding); an axis no longer than half the width is returned as it is."""
    pad = width // 2
    if x.shape[-1] <= pad:
        return x
    padded = np.pad(x, [(0, 0)] * (x.ndim - 1) + [(pad, pad)], mode="reflect")
    return np.sort(sliding_window_view(padded, width, axis=-1), axis=-1)[..., pad]


def dynamic_time_warping(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The cheapest monotonic path through ``matrix`` (tokens, frames) of costs, from its first
    cell to its last, stepping down, right or both: (token indices, frame indices) along it.
    Each anti-diagonal's cells are computed at once; the costs are float32 sums as
    transformers keeps them and ties go as its loop sends them (diagonal only when strictly
    cheapest, then up, else left), so the path is its path."""
    rows, cols = matrix.shape
    cost = np.full((rows + 1, cols + 1), np.inf, np.float32)
    trace = np.full((rows + 1, cols + 1), -1, np.int8)
    cost[0, 0] = 0
    for diagonal in range(2, rows + cols + 1):
        i = np.arange(max(1, diagonal - cols), min(rows, diagonal - 1) + 1)
        j = diagonal - i
        c0, c1, c2 = cost[i - 1, j - 1], cost[i - 1, j], cost[i, j - 1]
        step = np.where((c0 < c1) & (c0 < c2), 0, np.where((c1 < c0) & (c1 < c2), 1, 2))
        best = np.choose(step, [c0, c1, c2])
        cost[i, j] = matrix[i - 1, j - 1] + best.astype(np.float64)
        trace[i, j] = step
    trace[0, :], trace[:, 0] = 2, 1
    i, j = rows, cols
    text, time = [], []
    while i > 0 or j > 0:
        text.append(i - 1)
        time.append(j - 1)
        step = trace[i, j]
        if step == 0:
            i, j = i - 1, j - 1
        elif step == 1:
            i -= 1
        else:
            j -= 1
    return np.array(text[::-1]), np.array(time[::-1])


def token_times(weights: np.ndarray, frames: int, median_width: int,
                time_precision: float = 0.02) -> np.ndarray:
    """The time (seconds from the window's start) at which each of ``tokens`` decoded tokens
    begins, from the alignment heads' ``weights`` (heads, tokens - 1, src_len) of the tokens as
    the decoder's inputs (the last one never is). The first time is always 0 (the path starts
    at the first frame) and the last token gets the time of the one before; ``frames``: the
    window's real feature frames (the weights are cropped to their ``frames // 2`` encoder
    frames). Returns (tokens,) float64; a single token, 0."""
    weights = weights[..., : frames // 2].astype(np.float32)
    if weights.shape[1] == 0:
        return np.zeros(1)
    std = weights.std(axis=-2, keepdims=True)
    std[std == 0] = 1  # a frame every token attends alike: zeros after the mean, not NaN
    weights = (weights - weights.mean(axis=-2, keepdims=True)) / std
    matrix = median_filter(weights, median_width).mean(axis=0)
    text, time = dynamic_time_warping(-matrix.astype(np.float64))
    jumps = np.pad(np.diff(text), (1, 0), constant_values=1).astype(bool)
    jump_times = time[jumps] * time_precision
    return np.concatenate([jump_times, jump_times[-1:]])
