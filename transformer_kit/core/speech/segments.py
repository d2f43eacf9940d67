"""A window's tokens cut into timed segments, and how far the window moves on: transformers'
``WhisperGenerationMixin._retrieve_segment``, step for step, on numpy."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Segment:
    """A stretch of speech: its times in seconds from the audio's start, its text and tokens
    (text and timestamp ids), and how its window was decoded."""

    start: float
    end: float
    tokens: list[int]
    text: str = ""
    #: The window's average log probability per token (NaN under beam search, which reports
    #: none), its tokens' compression ratio and the temperature that decoded it (where
    #: fallback retried).
    avg_logprob: float = 0.0
    compression_ratio: float = 0.0
    temperature: float = 0.0
    #: The feature frame (10 ms) its window started at.
    seek: int = 0
    #: With word timestamps: dicts of ``word``, ``start``, ``end`` (seconds), and the time
    #: each of ``tokens`` begins.
    words: list[dict] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)


def window_segments(tokens: np.ndarray, time_offset: float, window_frames: int,
                    timestamp_begin: int, time_precision: float = 0.02,
                    frame_seconds: float = 0.01, input_stride: int = 2) -> tuple[list[Segment], int]:
    """Segments of one window's generated ``tokens`` (k,) (the end of text removed) and the
    feature frames to advance by.

    Args:
        time_offset: seconds from the audio's start to the window's.
        window_frames: the window's real feature frames (at most 3000).
        timestamp_begin: the id of <|0.00|>.
        time_precision: seconds per timestamp step; frame_seconds: per feature frame.
        input_stride: feature frames per timestamp step of the encoder (the stem's stride).
    """
    stamps = tokens >= timestamp_begin
    single_ending = stamps[-2:].tolist() == [False, True]
    # a pair of consecutive timestamps ends one segment and starts the next
    cuts = [i + 1 for i in range(len(stamps) - 1) if stamps[i] and stamps[i + 1]]
    if cuts:
        if single_ending:
            cuts.append(len(tokens))
        else:
            cuts[-1] += 1
        segments, last = [], 0
        for i, cut in enumerate(cuts):
            piece = tokens[last:cut]
            end_index = -1 if i < len(cuts) - 1 or single_ending else -2
            segments.append(Segment(
                start=time_offset + float(piece[0] - timestamp_begin) * time_precision,
                end=time_offset + float(piece[end_index] - timestamp_begin) * time_precision,
                tokens=piece.tolist()))
            last = cut
        if single_ending:  # no speech after the last segment in this window
            return segments, window_frames
        return segments, int(tokens[last - 2] - timestamp_begin) * input_stride
    # one segment: up to its last timestamp, or the whole window
    positions = np.flatnonzero(stamps)
    end = int(window_frames * frame_seconds / time_precision)
    if len(positions) and tokens[positions[-1]] != timestamp_begin:
        end = float(tokens[positions[-1]] - timestamp_begin)
    return [Segment(start=time_offset, end=time_offset + end * time_precision, tokens=tokens.tolist())], \
        window_frames
