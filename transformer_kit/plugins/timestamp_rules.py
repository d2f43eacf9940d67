"""Whisper's timestamp rules as a logits processor (transformers' WhisperTimeStampLogitsProcessor,
openai-whisper's ApplyTimestampRules), numpy only.

After the prompt, text and timestamp tokens alternate by these rules: the first token is a
timestamp (at most ``max_initial_timestamp_index`` steps in); timestamps come in pairs (a
segment's end, the next one's start) except before the end of text; they never decrease; and
where the timestamps together are more likely than the best text token, a timestamp it is.
"""

from __future__ import annotations

import numpy as np

from transformer_kit.core.decoding.processors import DecodingState, LogitsProcessor

NEVER = -np.inf


class TimestampRules(LogitsProcessor):
    """Args:
        timestamp_begin: the id of <|0.00|>; every id from it on is a timestamp.
        no_timestamps: <|notimestamps|> (never chosen once timestamps are wanted).
        end_of_text: <|endoftext|>; a lone timestamp may be followed by it or another timestamp.
        max_initial_timestamp_index: the first timestamp's furthest step (None: any).
    """

    def __init__(self, timestamp_begin: int, no_timestamps: int, end_of_text: int,
                 max_initial_timestamp_index: int | None = None) -> None:
        for name, value in (("timestamp_begin", timestamp_begin), ("no_timestamps", no_timestamps),
                            ("end_of_text", end_of_text)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a token id, got {value!r}")
        self.timestamp_begin, self.no_timestamps = timestamp_begin, no_timestamps
        self.end_of_text = end_of_text
        self.max_initial = max_initial_timestamp_index

    def __call__(self, scores: np.ndarray, state: DecodingState) -> np.ndarray:
        begin = self.timestamp_begin
        scores[:, self.no_timestamps] = NEVER
        generated = state.ids[:, state.prompt_length:]
        for k, seq in enumerate(generated):
            last = len(seq) >= 1 and seq[-1] >= begin
            penultimate = len(seq) < 2 or seq[-2] >= begin
            if last:
                if penultimate:  # a pair closed: text next
                    scores[k, begin:] = NEVER
                else:  # a segment's end: its next start or the end of text, no text
                    scores[k, :self.end_of_text] = NEVER
            stamps = seq[seq >= begin]
            if len(stamps):  # timestamps never decrease (a segment's end may repeat as the next start)
                floor = stamps[-1] if last and not penultimate else stamps[-1] + 1
                scores[k, begin:floor] = NEVER
        if generated.shape[1] == 0:  # the first token is a timestamp
            scores[:, :begin] = NEVER
            if self.max_initial is not None:
                scores[:, begin + self.max_initial + 1:] = NEVER
        # where the timestamps together outweigh the best text token, choose a timestamp
        logprobs = _log_softmax(scores)
        stamps_total = _logsumexp(logprobs[:, begin:])
        best_text = logprobs[:, :begin].max(axis=1)
        scores[stamps_total > best_text, :begin] = NEVER
        return scores


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    peak = x.max(axis=1, keepdims=True)
    return x - peak - np.log(np.exp(x - peak).sum(axis=1, keepdims=True))


def _logsumexp(x: np.ndarray) -> np.ndarray:
    peak = x.max(axis=1, keepdims=True)
    finite = np.where(np.isfinite(peak), peak, 0.0)
    with np.errstate(divide="ignore"):
        return (finite + np.log(np.exp(x - finite).sum(axis=1, keepdims=True)))[:, 0]
