"""Speech to text, the same for every runtime: Whisper's pipeline over any model that makes
features from samples and generates after a decoder prompt (PyTorch's or onnxruntime's).

The audio's log-mel features are computed once, over the whole signal (padded to 30 s when
shorter), and read in 30 s windows from ``seek``: each window is decoded after Whisper's prompt
(start of transcript, language, task, and <|notimestamps|> without timestamps; an initial
``prompt`` after <|startofprev|> before them) under its rules (suppressed tokens, timestamp
rules), retried at higher temperatures where the text repeats itself or is unlikely, cut into
segments at its timestamps, and the window moves on to the last complete segment's end; as
transformers' long-form ``generate`` does it.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from transformer_kit.core.errors import ConfigError, InputError
from transformer_kit.core.speech.alignment import token_times
from transformer_kit.core.speech.segments import Segment, window_segments
from transformer_kit.core.speech.words import timed_words
from transformer_kit.core.speech_config import CHUNK_SECONDS, HOP_LENGTH, SAMPLING_RATE, SpeechConfig

#: Feature frames per window (30 s), and per timestamp step of the encoder.
WINDOW_FRAMES = CHUNK_SECONDS * SAMPLING_RATE // HOP_LENGTH
INPUT_STRIDE = 2
#: openai-whisper's temperatures to fall back through, and its thresholds.
FALLBACK_TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)


@dataclass(frozen=True)
class TranscribeOptions:
    """How to transcribe (openai-whisper's and transformers' names where they have one).

    Args:
        language: the spoken language's code ("en", "de", ...); None: detected from the first
            window (multilingual models), English for English-only ones.
        task: "transcribe", or "translate" (into English; multilingual models).
        timestamps: segment timestamps (the windows then move on by them); False: one segment
            per window, timed by the window.
        prompt: text that came before (names, spellings), given after <|startofprev|>.
        temperature: one temperature, or several to fall back through (0: greedy or beams).
        compression_ratio_threshold: retry at the next temperature when the tokens compress
            better than this (the text repeats itself); None: never.
        logprob_threshold: retry when the average log probability per token is below this.
        condition_on_previous_text: give each window the text of the ones before as its prompt
            (more consistent; can repeat a hallucination).
        num_beams: beam search at temperature 0 (1: greedy).
        max_new_tokens: tokens per window at most (None: as many as the decoder's positions
            leave after the prompt).
        seed: the sampling's seed at temperatures above 0.
        word_timestamps: time each word (and token) by the alignment heads' cross attention:
            each segment's ``words`` and ``token_times``, the transcription's ``words``.
    """

    language: str | None = None
    task: Literal["transcribe", "translate"] = "transcribe"
    timestamps: bool = True
    prompt: str | None = None
    temperature: float | tuple[float, ...] = FALLBACK_TEMPERATURES
    compression_ratio_threshold: float | None = 2.4
    logprob_threshold: float | None = -1.0
    condition_on_previous_text: bool = False
    num_beams: int = 1
    max_new_tokens: int | None = None
    seed: int = 0
    word_timestamps: bool = False


@dataclass
class Transcription:
    """What a transcription gives: the text, its segments, the language and the duration (s)."""

    text: str
    segments: list[Segment]
    language: str | None
    duration: float
    task: str = "transcribe"
    words: list[dict] = field(default_factory=list)


#: ``generate(features (rows, channels, frames), max_new_tokens, decoder_input_ids (rows, k),
#: **options) -> (tokens (rows, steps) int64, per-row lists of each token's log probability, or
#: None for beam search)``.
Generate = Callable[..., tuple[np.ndarray, list[list[float]] | None]]
#: ``align(features (1, channels, frames), decoder input ids (1, len)) -> the alignment heads'
#: cross-attention probabilities (1, heads, len, src_len)``, teacher-forced.
Align = Callable[[np.ndarray, np.ndarray], np.ndarray]


class Transcriber:
    """Whisper's pipeline over a model's two calls.

    Args:
        settings: the model config's ``speech``.
        features: samples (1, n) float32 -> log-mel features (1, channels, n // 160).
        generate: see :data:`Generate`.
        tokenizer: decodes tokens to text and encodes prompts (``decode``, ``encode``).
        vocab: the target vocabulary's size; positions: the decoder's (448).
        align: see :data:`Align` (word timestamps); None: the model has no way to.
    """

    def __init__(self, settings: SpeechConfig, features: Callable[[np.ndarray], np.ndarray],
                 generate: Generate, tokenizer: Any, vocab: int, positions: int,
                 align: Align | None = None) -> None:
        self.settings, self.features, self.generate = settings, features, generate
        self.tokenizer, self.vocab, self.positions = tokenizer, vocab, positions
        self.align = align

    # -- the prompt ---------------------------------------------------------------------------
    def language_id(self, language: str | None, window: np.ndarray) -> tuple[str | None, int | None]:
        """The language's code and token (detected on ``window`` when None), or (None, None)
        for an English-only model."""
        s = self.settings
        if not s.multilingual:
            if language not in (None, "en"):
                raise InputError(f"This model is English-only; language {language!r} cannot be "
                                 "transcribed (give 'en', or none).")
            return "en", None
        if not s.languages:
            raise ConfigError("This multilingual model's config lists no languages (speech."
                              "languages); export it from a checkpoint whose generation_config.json "
                              "has lang_to_id.")
        if language is None:
            return self.detect_language(window)
        code = language.lower()
        if code not in s.languages:
            raise InputError(f"Language {language!r} is not one of this model's "
                             f"{len(s.languages)} ({', '.join(sorted(s.languages)[:12])}, ...).")
        return code, s.languages[code]

    def check(self, options: TranscribeOptions) -> None:
        """Refuse, before any audio is decoded, what this model cannot do: a language it does
        not know, a translation by an English-only model."""
        s = self.settings
        if options.language is not None and (s.multilingual or options.language != "en"):
            self.language_id(options.language, np.zeros(0, np.float32))
        self.start_tokens(0, options.task, options.timestamps)
        if options.word_timestamps and not s.alignment_heads:
            raise InputError("Word timestamps need the model's alignment heads, and its config "
                             "names none (speech.alignment_heads); transcribe without them.")
        if options.word_timestamps and self.align is None:
            raise InputError("This model cannot time words: its export has no alignment graph. "
                             "Export it again with this version of the kit.")

    def detect_language(self, window: np.ndarray) -> tuple[str, int]:
        """The most likely language of a window (1, channels, 3000): the decoder's first token
        after the start of transcript, among the language tokens (openai's detect_language)."""
        ids = set(self.settings.languages.values())
        others = [i for i in range(self.vocab) if i not in ids]
        tokens, _ = self.generate(window, 1, np.array([[self.settings.start_of_transcript]]),
                                  logits_processors=[{"name": "suppress_tokens", "token_ids": others}])
        chosen = int(tokens[0, 0])
        return next(code for code, i in self.settings.languages.items() if i == chosen), chosen

    def start_tokens(self, language_id: int | None, task: str, timestamps: bool) -> list[int]:
        """<|startoftranscript|> [<|lang|> <|task|>] [<|notimestamps|>]."""
        s = self.settings
        tokens = [s.start_of_transcript]
        if s.multilingual:
            tokens += [language_id, s.translate if task == "translate" else s.transcribe]
        elif task == "translate":
            raise InputError("This model is English-only and cannot translate; use task "
                             "'transcribe', or a multilingual model.")
        if not timestamps:
            tokens.append(s.no_timestamps)
        return tokens

    def prompt_tokens(self, prompt: str | None) -> list[int]:
        """<|startofprev|> and the prompt's tokens (with a leading space, as transformers'
        ``get_prompt_ids``), or [] for none."""
        if not prompt:
            return []
        ids, _ = self.tokenizer.encode([" " + prompt.strip()], add_special_tokens=False)
        return [self.settings.start_of_prev, *ids[0].tolist()]

    def processors(self, timestamps: bool) -> list[dict]:
        s = self.settings
        out = []
        if s.suppress_tokens:
            out.append({"name": "suppress_tokens", "token_ids": list(s.suppress_tokens)})
        if s.begin_suppress_tokens:
            out.append({"name": "suppress_at_begin", "token_ids": list(s.begin_suppress_tokens)})
        if timestamps:
            out.append({"name": "whisper_timestamps", "timestamp_begin": s.timestamp_begin,
                        "no_timestamps": s.no_timestamps, "end_of_text": s.end_of_text,
                        "max_initial_timestamp_index": s.max_initial_timestamp_index})
        return out

    # -- decoding ------------------------------------------------------------------------------
    def decode_window(self, window: np.ndarray, prompt: list[int], options: TranscribeOptions,
                      processors: list[dict]) -> tuple[np.ndarray, float, float, float, bool]:
        """One window's generated tokens (the end of text removed), their average log
        probability and compression ratio, the temperature that gave them (the first of
        ``options.temperature`` whose result passes the thresholds, else the last), and whether
        the end of text ended them."""
        temperatures = options.temperature
        if not isinstance(temperatures, tuple):
            temperatures = (temperatures,)
        room = self.positions - len(prompt)
        if room < 1:
            raise InputError(f"The prompt takes {len(prompt)} of the decoder's {self.positions} "
                             "positions; give a shorter prompt.")
        steps = room if options.max_new_tokens is None else min(options.max_new_tokens, room)
        for i, temperature in enumerate(temperatures):
            decoding: dict[str, Any] = {"logits_processors": processors}
            if temperature > 0:
                decoding.update(do_sample=True, temperature=temperature, seed=options.seed + i)
            else:
                decoding["num_beams"] = options.num_beams
            tokens, logprobs = self.generate(window, steps, np.array([prompt]), **decoding)
            row = _until_end(tokens[0], self.settings.end_of_text)
            avg = math.nan  # beam search: no per-token log probabilities, no logprob threshold
            if logprobs is not None:
                kept = logprobs[0][:len(row) + (len(row) < len(tokens[0]))]  # with the end of text
                avg = float(np.sum(kept) / max(len(kept), 1))
            ratio = compression_ratio(row, self.vocab)
            too_repetitive = (options.compression_ratio_threshold is not None
                              and ratio > options.compression_ratio_threshold)
            too_unlikely = (options.logprob_threshold is not None and not math.isnan(avg)
                            and avg < options.logprob_threshold)
            if not (too_repetitive or too_unlikely) or i == len(temperatures) - 1:
                return row, avg, ratio, temperature, len(row) < len(tokens[0])
        raise AssertionError("unreachable")

    def transcribe(self, samples: np.ndarray, options: TranscribeOptions | None = None,
                   progress: Callable[[float, float], None] | None = None,
                   on_segments: Callable[[list[Segment]], None] | None = None) -> Transcription:
        """(n,) float32 16 kHz samples -> a :class:`Transcription`; ``progress(done, total)``
        in seconds after each window, ``on_segments(segments)`` with each window's segments
        once they are final (a stream's pieces)."""
        options = options or TranscribeOptions()
        self.check(options)
        duration = len(samples) / SAMPLING_RATE
        padded = samples if len(samples) > CHUNK_SECONDS * SAMPLING_RATE else np.pad(
            samples, (0, CHUNK_SECONDS * SAMPLING_RATE - len(samples)))
        features = self.features(padded[None].astype(np.float32))  # (1, channels, frames)
        # the frames a sample falls in, as transformers counts them (its attention mask's):
        # one more than the features where the last frame is partial (zeros are read there)
        frames = -(-len(padded) // HOP_LENGTH)
        language, language_id = self.language_id(options.language, _window(features, 0, frames))
        start = self.start_tokens(language_id, options.task, options.timestamps)
        prompt = self.prompt_tokens(options.prompt)
        processors = self.processors(options.timestamps)
        real_frames = -(-len(samples) // HOP_LENGTH)  # the audio's own, the padding not counted
        segments: list[Segment] = []
        seek = 0
        while seek < frames:
            window_frames = min(frames - seek, WINDOW_FRAMES)
            previous = self.previous_tokens(segments) if options.condition_on_previous_text else []
            window = _window(features, seek, window_frames)
            decoder_prompt = (previous or prompt) + start
            tokens, avg, ratio, temperature, ended = self.decode_window(
                window, decoder_prompt, options, processors)
            found, advance = window_segments(tokens, seek * HOP_LENGTH / SAMPLING_RATE, window_frames,
                                             self.settings.timestamp_begin,
                                             self.settings.time_precision, HOP_LENGTH / SAMPLING_RATE,
                                             INPUT_STRIDE)
            for segment in found:
                segment.text = self.text(segment.tokens)
                segment.avg_logprob, segment.compression_ratio = avg, ratio
                segment.temperature, segment.seek = temperature, seek
            if options.word_timestamps:
                times = self.window_token_times(window, decoder_prompt, tokens, ended,
                                                real_frames - seek) + seek * HOP_LENGTH / SAMPLING_RATE
                self.time_words(found, times, language)
            segments += found
            seek += advance
            if on_segments is not None:
                on_segments(found)
            if progress is not None:
                progress(min(seek * HOP_LENGTH / SAMPLING_RATE, duration), duration)
        return Transcription(text="".join(s.text for s in segments), segments=segments,
                             language=language, duration=duration, task=options.task,
                             words=[w for s in segments for w in s.words])

    def window_token_times(self, window: np.ndarray, prompt: list[int], tokens: np.ndarray,
                           ended: bool, real_frames: int) -> np.ndarray:
        """The time (seconds from the window's start) of each of its generated ``tokens`` (k,)
        and of the token after them (the end of text, else the last one's again): (k + 1,).
        Read, as transformers reads them off generation, from the alignment heads' weights of
        the prompt and tokens as the decoder's input (the last token generated, the end of text
        where it ended, never is one); ``real_frames``: the audio's feature frames from the
        window's start."""
        s = self.settings
        generated = [*tokens.tolist(), s.end_of_text] if ended else tokens.tolist()
        if len(generated) < 2:  # no generated token was the decoder's input: transformers' zeros
            return np.zeros(len(tokens) + 1)
        ids = np.array([[*prompt, *generated[:-1]]], np.int64)
        weights = self.align(window, ids)[0, :, len(prompt):]
        times = token_times(weights, min(real_frames, WINDOW_FRAMES), s.median_filter_width,
                            s.time_precision)
        return times if ended else np.concatenate([times, times[-1:]])

    def time_words(self, segments: list[Segment], times: np.ndarray, language: str | None) -> None:
        """Each of a window's ``segments`` (its tokens in turn) gets its tokens' times as
        ``token_times``, and its timed words; ``times``: one per token of the window and one
        more."""
        start = 0
        for segment in segments:
            end = start + len(segment.tokens)
            segment.token_times = [round(float(t), 2) for t in times[start:end]]
            segment.words = timed_words(self.tokenizer, segment.tokens, times[start:end + 1],
                                        self.settings.end_of_text, language)
            start = end

    def previous_tokens(self, segments: Sequence[Segment]) -> list[int]:
        """<|startofprev|> and the last tokens of the segments so far (at most half the
        decoder's positions, as transformers cuts them), the closing timestamp pair's second
        timestamp left out."""
        tokens = [t for s in segments for t in s.tokens]
        if len(tokens) >= 2 and all(t >= self.settings.timestamp_begin for t in tokens[-2:]):
            tokens = tokens[:-1]
        if not tokens:
            return []
        return [self.settings.start_of_prev, *tokens[-(self.positions // 2 - 1):]]

    def text(self, tokens: Sequence[int]) -> str:
        """A segment's text: its tokens less the timestamps, decoded."""
        return self.tokenizer.decode([t for t in tokens if t < self.settings.timestamp_begin])


def _until_end(tokens: np.ndarray, end: int) -> np.ndarray:
    """A generated row up to (without) its first end of text."""
    ends = np.flatnonzero(tokens == end)
    return tokens[:ends[0]] if len(ends) else tokens


def _window(features: np.ndarray, seek: int, frames: int) -> np.ndarray:
    """``frames`` feature frames from ``seek``, zero-padded to a 30 s window (as transformers
    pads a long-form window: zeros in the log-mel domain)."""
    piece = features[:, :, seek:seek + frames]
    if piece.shape[-1] < WINDOW_FRAMES:
        piece = np.pad(piece, ((0, 0), (0, 0), (0, WINDOW_FRAMES - piece.shape[-1])))
    return np.ascontiguousarray(piece, dtype=np.float32)


def compression_ratio(tokens: np.ndarray, vocab: int) -> float:
    """How well a window's tokens compress: their bytes (each id in the fewest whole bytes its
    vocabulary needs) over zlib's (transformers' ``_retrieve_compression_ratio``)."""
    width = int(math.log2(vocab) / 8) + 1
    data = b"".join(int(t).to_bytes(width, "little") for t in tokens)
    return len(data) / len(zlib.compress(data)) if data else 0.0


def model_generate(model: Any, to_input: Callable[[np.ndarray], Any]) -> Generate:
    """:data:`Generate` over a model's ``generate`` (PyTorch's or onnxruntime's): inputs made
    by ``to_input`` (a tensor for PyTorch), each token's log probability from the scores it was
    chosen from (``logprobs_mode="processed"``)."""
    from transformer_kit.core.decoding.prompts import as_array

    def generate(features: np.ndarray, steps: int, prompt: np.ndarray, **options: Any
                 ) -> tuple[np.ndarray, list[list[float]] | None]:
        if options.get("num_beams", 1) > 1:  # beams report no per-token log probabilities
            out = model.generate(to_input(features), steps, decoder_input_ids=to_input(prompt), **options)
            return as_array(out, "tokens"), None
        out = model.generate(to_input(features), steps, decoder_input_ids=to_input(prompt),
                             logprobs=0, logprobs_mode="processed", **options)
        return as_array(out.sequences, "tokens"), [[r.logprob for r in row] for row in out.logprobs]

    return generate


def transcribe_options(**options: Any) -> TranscribeOptions:
    """:class:`TranscribeOptions` from keywords; an unknown or ill-typed one refused with a
    sentence naming the allowed ones."""
    allowed = list(TranscribeOptions.__dataclass_fields__)
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise InputError(f"Unknown transcription option {unknown[0]!r}; allowed: {', '.join(allowed)}.")
    temperature = options.get("temperature")
    if isinstance(temperature, list):
        options["temperature"] = tuple(temperature)
    problems = _option_problems(options)
    if problems:
        raise InputError("Invalid transcription options: " + "; ".join(problems) + ".")
    return TranscribeOptions(**options)


def _option_problems(options: dict[str, Any]) -> list[str]:
    problems = []
    temperature = options.get("temperature", 0.0)
    temps = temperature if isinstance(temperature, tuple) else (temperature,)
    if not temps or not all(isinstance(t, (int, float)) and not isinstance(t, bool)
                            and 0 <= t <= 2 and math.isfinite(t) for t in temps):
        problems.append(f"temperature must be a number from 0 to 2, or a list of them (given "
                        f"{temperature!r})")
    if options.get("task", "transcribe") not in ("transcribe", "translate"):
        problems.append(f"task must be 'transcribe' or 'translate' (given {options['task']!r})")
    beams = options.get("num_beams", 1)
    if isinstance(beams, bool) or not isinstance(beams, int) or not 1 <= beams <= 16:
        problems.append(f"num_beams must be an integer from 1 to 16 (given {beams!r})")
    steps = options.get("max_new_tokens")
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
        problems.append(f"max_new_tokens must be a positive integer or None (given {steps!r})")
    if not isinstance(options.get("word_timestamps", False), bool):
        problems.append(f"word_timestamps must be true or false (given {options['word_timestamps']!r})")
    for key in ("language", "prompt"):
        if options.get(key) is not None and not isinstance(options[key], str):
            problems.append(f"{key} must be a string or None (given {options[key]!r})")
    return problems
