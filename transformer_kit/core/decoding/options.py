"""``GenerationConfig``: every decoding option, validated once, the same for every runtime.

Option names and meanings follow Hugging Face's ``GenerationConfig`` so users can move between
the two; where the kit differs it says so (``top_k`` is off unless given, ``eos_id`` may list
several ids, ``stop`` takes strings and needs a tokenizer).
"""

from __future__ import annotations

import warnings
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from transformer_kit.core.config import ComponentSpec
from transformer_kit.core.decoding.logprobs import MAX_TOP_LOGPROBS
from transformer_kit.core.decoding.response_format import grammar_of
from transformer_kit.core.errors import InputError

#: Options that shape the distribution a token is sampled from; they do nothing without sampling.
SAMPLING_OPTIONS = ("temperature", "top_k", "top_p", "min_p")


class GenerationConfig(BaseModel):
    """How ``generate`` and ``stream`` choose tokens (PyTorch and onnxruntime alike).

    Strategy: greedy by default; ``do_sample=True`` samples; ``num_beams > 1`` runs beam search
    (sampled beams with ``do_sample=True``). A row ends at any id of ``eos_id``, at a ``stop``
    string, or after ``max_new_tokens``; never before ``min_new_tokens``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    max_new_tokens: int = Field(32, ge=0, description="Most tokens to generate per row.")
    min_new_tokens: int = Field(0, ge=0, description="Rows cannot end (eos or stop) before this.")
    do_sample: bool = Field(False, description="Sample tokens instead of taking the most likely.")
    temperature: float = Field(1.0, gt=0, description="Divides the logits before sampling.")
    top_k: int | None = Field(None, ge=0, description="Sample among the k most likely (0/None: off).")
    top_p: float = Field(1.0, gt=0, le=1, description="Sample within this probability mass.")
    min_p: float | None = Field(None, ge=0, le=1,
                                description="Drop tokens below min_p x the top probability.")
    repetition_penalty: float = Field(1.0, gt=0,
                                      description="> 1 discourages tokens already in the row.")
    presence_penalty: float = Field(
        0.0, ge=-2, le=2, description="OpenAI's: subtracted once from the score of every token "
        "generated so far (the prompt's not counted); > 0 favours new tokens.")
    frequency_penalty: float = Field(
        0.0, ge=-2, le=2, description="OpenAI's: subtracted from a token's score once per time it "
        "was generated so far (the prompt's not counted); > 0 discourages repeats.")
    logit_bias: dict[int, float] | None = Field(
        None, description="Token id -> a number from -100 to 100 added to its score before the "
        "penalties (OpenAI's logit_bias; -100 all but bans a token, 100 all but forces it).")
    no_repeat_ngram_size: int = Field(0, ge=0, description="No n-gram of this size occurs twice.")
    num_beams: int = Field(1, ge=1, description="Beam search with this many beams (1: off).")
    length_penalty: float = Field(1.0, description="Beam scores are divided by length**this.")
    early_stopping: bool | Literal["never"] = Field(
        False, description="Beam search: stop when num_beams hypotheses finished (True), by a "
        "heuristic (False), or only when no better one is possible ('never').")
    num_return_sequences: int = Field(1, ge=1, description="Rows returned per prompt.")
    eos_id: int | list[int] | None = Field(
        None, description="Ids that end a row; None: the model's eos_id; []: none.")
    forced_bos_id: int | None = Field(
        None, ge=0, description="The first new token of every row, forced (Hugging Face's "
        "forced_bos_token_id, BART's); None: the model config's forced_bos_id.")
    stop: list[str] = Field(default_factory=list,
                            description="Strings that end a row (needs a tokenizer).")
    seed: int | None = Field(None, ge=0, description="Seed of the sampler: same seed, same tokens.")
    logits_processors: list[ComponentSpec] = Field(
        default_factory=list, description="Registered logits processors to apply, in order.")
    prompt_lookup_num_tokens: int | None = Field(
        None, ge=1, description="Speculative decoding with prompt lookup: draft up to this many "
        "tokens a step from earlier text (the prompt and the output), checked in one step of the "
        "model; the same tokens as without it (greedy), or the same distribution (sampling).")
    max_matching_ngram_size: int = Field(
        2, ge=1, description="Prompt lookup: the longest run of last tokens looked up.")
    num_assistant_tokens: int = Field(
        5, ge=1, description="Speculative decoding with an assistant model (generate's "
        "assistant_model): the most tokens it drafts a step.")
    logprobs: int | None = Field(
        None, ge=0, le=MAX_TOP_LOGPROBS, description="Report each new token's log probability "
        "and this many of the most likely tokens at its step (0: the chosen token's alone; "
        "None: no report).")
    logprobs_mode: Literal["raw", "processed"] = Field(
        "raw", description="What the reported log probabilities are of: 'raw', the model's "
        "logits (vLLM's raw_logprobs); 'processed', the scores the token was chosen from, after "
        "penalties, the grammar and the sampling warpers (vLLM's processed_logprobs).")
    response_format: dict[str, Any] | None = Field(
        None, description="Structured output: {'type': 'json_object' | 'json_schema' | 'regex' | "
        "'choice' | 'grammar' | 'text', ...} (see transformer_kit.core.decoding.response_format).")

    @field_validator("max_new_tokens", "min_new_tokens", "top_k", "no_repeat_ngram_size",
                     "num_beams", "num_return_sequences", "seed", "temperature", "top_p",
                     "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty",
                     "length_penalty", "prompt_lookup_num_tokens",
                     "max_matching_ngram_size", "num_assistant_tokens", "logprobs", mode="before")
    @classmethod
    def _numbers_are_not_booleans(cls, value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError("a boolean is not a number here")
        if hasattr(value, "item") and hasattr(value, "dtype"):  # numpy / torch scalars
            return value.item()
        return value

    @field_validator("eos_id", mode="before")
    @classmethod
    def _eos_ids(cls, value: Any) -> Any:
        ids = value if isinstance(value, (list, tuple)) else [value] if value is not None else []
        if any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in ids):
            raise ValueError("give a non-negative token id or a list of them")
        return list(value) if isinstance(value, tuple) else value

    @field_validator("logit_bias", mode="before")
    @classmethod
    def _token_biases(cls, value: Any) -> Any:
        # strings are refused rather than read as ids: a JSON body's keys are the server's to read
        if not isinstance(value, dict):
            return value
        items = [(k.item() if hasattr(k, "item") else k, v.item() if hasattr(v, "item") else v)
                 for k, v in value.items()]
        if any(isinstance(k, bool) or not isinstance(k, int) or k < 0 for k, _ in items):
            raise ValueError("give non-negative integer token ids as its keys")
        if any(isinstance(v, bool) or not isinstance(v, (int, float)) or not -100 <= v <= 100
               for _, v in items):
            raise ValueError("give each token a number from -100 to 100")
        return dict(items)

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_strings(cls, value: Any) -> Any:
        value = [value] if isinstance(value, str) else value
        if isinstance(value, (list, tuple)) and any(not isinstance(s, str) or not s for s in value):
            raise ValueError("give non-empty strings")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> GenerationConfig:
        if self.min_new_tokens > self.max_new_tokens:
            raise ValueError(f"min_new_tokens ({self.min_new_tokens}) is more than max_new_tokens "
                             f"({self.max_new_tokens}); lower min_new_tokens or raise max_new_tokens")
        if self.num_beams > 1 and self.num_return_sequences > self.num_beams:
            raise ValueError(f"num_return_sequences ({self.num_return_sequences}) is more than "
                             f"num_beams ({self.num_beams}): beam search returns at most its beams")
        if self.num_beams == 1 and not self.do_sample and self.num_return_sequences > 1:
            raise ValueError(f"num_return_sequences={self.num_return_sequences} with greedy decoding "
                             "would return the same row several times; set do_sample=True or "
                             "num_beams >= num_return_sequences")
        if self.logprobs is not None and self.num_beams > 1:
            raise ValueError(f"logprobs are reported for greedy search and sampling; beam search "
                             f"(num_beams={self.num_beams}) reorders rows as it goes. Use "
                             "num_beams=1 or leave logprobs out")
        self._check_prompt_lookup()
        self._check_response_format()
        if not self.do_sample:
            given = [name for name in SAMPLING_OPTIONS if name in self.model_fields_set
                     and getattr(self, name) != GenerationConfig.model_fields[name].default]
            if given:
                warnings.warn(f"{', '.join(given)} only change sampling, and do_sample is False; "
                              "set do_sample=True to use them.", UserWarning, stacklevel=4)
        return self

    def _check_prompt_lookup(self) -> None:
        """Prompt lookup drafts one row, unconstrained: refused with beams, several sequences or
        a response_format."""
        if self.prompt_lookup_num_tokens is None:
            return
        if self.num_beams > 1 or self.num_return_sequences > 1:
            raise ValueError(f"prompt_lookup_num_tokens drafts one row's tokens, so it cannot run "
                             f"with num_beams={self.num_beams} or num_return_sequences="
                             f"{self.num_return_sequences}; use 1 for both or leave it out")
        if self.response_format is not None:
            raise ValueError("prompt_lookup_num_tokens cannot run with response_format (drafts "
                             "are not checked against its grammar); leave one of them out")

    def _check_response_format(self) -> None:
        """A response_format is refused with beams or min_new_tokens, and when llguidance cannot
        use it."""
        if self.response_format is None:
            return
        if self.num_beams > 1:
            raise ValueError(f"response_format constrains each row by a grammar, which beam "
                             f"search cannot follow as it reorders rows (num_beams="
                             f"{self.num_beams}); use num_beams=1 (greedy search or sampling)")
        if self.min_new_tokens:
            raise ValueError("response_format ends the reply where its grammar is complete, "
                             "so min_new_tokens cannot hold it open; leave min_new_tokens out")
        grammar_of(self.response_format)  # refuses a format llguidance cannot use, now

    @property
    def strategy(self) -> str:
        """``"greedy"``, ``"sample"``, ``"beam"`` or ``"beam_sample"``."""
        if self.num_beams > 1:
            return "beam_sample" if self.do_sample else "beam"
        return "sample" if self.do_sample else "greedy"

    def eos_ids(self, model_eos: int | list[int] | None) -> list[int]:
        """The ids that end a row: ``eos_id`` as given, else the model's (one id or a list)."""
        given = model_eos if self.eos_id is None else self.eos_id
        if given is None:
            return []
        return [given] if isinstance(given, int) else list(given)


def generation_config(config: GenerationConfig | dict | None = None, **options: Any) -> GenerationConfig:
    """One validated :class:`GenerationConfig` from a config (or dict) and keyword overrides.

    Raises :class:`~transformer_kit.InputError` naming the first bad option and what it allows.
    """
    if isinstance(config, GenerationConfig):
        base = config.model_dump(exclude_unset=True)
    elif isinstance(config, dict):
        base = dict(config)
    elif config is None:
        base = {}
    else:
        raise InputError(f"generation_config must be a GenerationConfig or a dict, got "
                         f"{type(config).__name__}.")
    try:
        return GenerationConfig(**{**base, **options})
    except ValidationError as exc:
        raise InputError(_describe(exc)) from None


def _describe(exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(part) for part in error["loc"])
    message = error["msg"].removeprefix("Value error, ").rstrip(".")
    if error["type"] == "extra_forbidden":
        known = ", ".join(GenerationConfig.model_fields)
        return f"Unknown generation option {where!r}; the options are: {known}."
    if not where:
        return f"Generation options do not fit together: {message}."
    return f"Generation option {where}={error.get('input')!r} is not allowed: {message}."
