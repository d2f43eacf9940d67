"""What a served request may ask of decoding and of its text beyond OpenAI's temperature,
top_p, seed and stop: OpenAI's penalties and logit bias, and vLLM's sampling extras, as every
front-end hands them to :class:`~.service.Service`. Each default changes nothing, so a request
that gives none decodes as before."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RequestOptions:
    """A request's further decoding options (vLLM's names; ``None``: the checkpoint's default
    where it has one, else off).

    Attributes:
        presence_penalty: subtracted once from every token generated so far (-2 to 2).
        frequency_penalty: subtracted per time a token was generated so far (-2 to 2).
        logit_bias: token id -> added to its score (-100 to 100).
        top_k: sample among the k most likely; 0 or -1 off, None: the checkpoint's.
        min_p: drop tokens below min_p x the top probability; 0 off, None: the checkpoint's.
        repetition_penalty: transformers' (prompt and output, by a factor); None: the
            checkpoint's.
        min_tokens: no end id nor stop string ends the reply before this many tokens.
        ignore_eos: the model's end ids do not end the reply (``stop_token_ids`` still do).
        stop_token_ids: more ids that end the reply (finish reason "stop").
        include_stop_str_in_output: the text keeps the stop string (or stop token) it ended at.
        skip_special_tokens: False: special tokens appear in the text.
        logprobs: report each new token's log probability and this many of the most likely
            (None: no report); ``logprobs_mode`` "raw" or "processed" (None: "raw").
        prompt_logprobs: the same for each prompt token (None: no report).
    """

    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    logprobs: int | None = None
    logprobs_mode: str | None = None
    prompt_logprobs: int | None = None

    def reports(self) -> dict[str, Any]:
        """The generation options of the log probability reports ({}: none asked for)."""
        if self.logprobs is None:
            return {}
        return {"logprobs": self.logprobs,
                **({"logprobs_mode": self.logprobs_mode} if self.logprobs_mode is not None else {})}

    def penalties(self) -> dict[str, Any]:
        """The generation options of the penalties and the bias that are on (greedy or not)."""
        options: dict[str, Any] = {}
        if self.presence_penalty:
            options["presence_penalty"] = self.presence_penalty
        if self.frequency_penalty:
            options["frequency_penalty"] = self.frequency_penalty
        if self.logit_bias:
            options["logit_bias"] = dict(self.logit_bias)
        return options

    def warpers(self, defaults: dict[str, Any]) -> dict[str, Any]:
        """``top_k`` and ``min_p`` in effect when sampling: the request's (0, or -1 for top_k,
        turns one off, the checkpoint's too), else the checkpoint's ``defaults``."""
        options: dict[str, Any] = {}
        top_k = defaults.get("top_k") if self.top_k is None else self.top_k
        if top_k is not None and top_k > 0:
            options["top_k"] = top_k
        min_p = defaults.get("min_p") if self.min_p is None else self.min_p
        if min_p:
            options["min_p"] = min_p
        return options
