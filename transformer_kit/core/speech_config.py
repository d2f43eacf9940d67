"""The config of a speech model's transcription (Whisper's): its special tokens, languages,
suppressed tokens and alignment heads, as a checkpoint's generation_config.json holds them."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

#: Whisper's audio: samples per second, seconds per window, samples per feature frame.
SAMPLING_RATE, CHUNK_SECONDS, HOP_LENGTH = 16000, 30, 160


class SpeechConfig(BaseModel):
    """What Whisper's decoding rules need (transformers' WhisperGenerationConfig, renamed).

    The token ids: ``start_of_transcript``, then a language (multilingual models), the task
    (``transcribe`` or ``translate``), ``no_timestamps`` unless timestamps are wanted; text
    and timestamps (``timestamp_begin`` is <|0.00|>, each id after it 0.02 s later) until
    ``end_of_text``. ``start_of_prev`` begins an initial prompt before the start of transcript.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    start_of_transcript: int = Field(ge=0)
    end_of_text: int = Field(ge=0)
    transcribe: int = Field(ge=0)
    translate: int = Field(ge=0)
    start_of_prev: int = Field(ge=0)
    no_speech: int = Field(ge=0, description="<|nocaptions|> (<|nospeech|>): the probability "
                           "after the start of transcript that a window holds no speech.")
    no_timestamps: int = Field(ge=0)
    timestamp_begin: int = Field(ge=0, description="<|0.00|>; each later id is 0.02 s later.")
    multilingual: bool = Field(description="Whether the prompt names a language (English-only "
                               "models' prompts do not).")
    languages: dict[str, int] = Field(default_factory=dict, description="Language code -> its "
                                      "token id (<|en|> ...).")
    suppress_tokens: list[int] = Field(default_factory=list, description="Never chosen.")
    begin_suppress_tokens: list[int] = Field(default_factory=list, description="Never the first "
                                             "token (a blank, the end of text).")
    alignment_heads: list[list[int]] = Field(
        default_factory=list, description="[layer, head] pairs of decoder cross attention whose "
        "weights align tokens with audio frames (word timestamps).")
    max_initial_timestamp_index: int | None = Field(
        50, ge=0, description="The first timestamp is at most this many 0.02 s steps in.")
    median_filter_width: int = Field(7, gt=0, description="Frames of the median filter over the "
                                     "alignment heads' weights (odd).")
    time_precision: float = Field(0.02, gt=0, description="Seconds per timestamp token.")

    def token_problems(self, vocab: int, layers: int, heads: int) -> list[str]:
        """Ids outside a target vocabulary of ``vocab``, alignment heads outside ``layers``
        decoder layers of ``heads`` heads."""
        problems = []
        ids = {name: getattr(self, name) for name in (
            "start_of_transcript", "end_of_text", "transcribe", "translate", "start_of_prev",
            "no_speech", "no_timestamps", "timestamp_begin")}
        ids.update({f"languages.{code}": i for code, i in self.languages.items()})
        ids.update({f"suppress_tokens[{i}]": t for i, t in enumerate(self.suppress_tokens)})
        ids.update({f"begin_suppress_tokens[{i}]": t for i, t in enumerate(self.begin_suppress_tokens)})
        for name, value in ids.items():
            if not 0 <= value < vocab:
                problems.append(f"'speech.{name}' ({value}) must be a token id below the "
                                f"vocabulary size ({vocab})")
        for pair in self.alignment_heads:
            if len(pair) != 2 or not (0 <= pair[0] < layers and 0 <= pair[1] < heads):
                problems.append(f"'speech.alignment_heads' entry {pair} must be [layer, head] with a "
                                f"layer below {layers} and a head below {heads}")
        if self.median_filter_width % 2 == 0:
            problems.append(f"'speech.median_filter_width' ({self.median_filter_width}) must be odd")
        return problems
