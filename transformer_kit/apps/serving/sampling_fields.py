"""The sampling fields ``/v1/completions`` and ``/v1/chat/completions`` share beyond
temperature, top_p, seed and stop: OpenAI's ``n``, penalties and ``logit_bias``, and vLLM's
sampling extras (``top_k``, ``min_p``, ``repetition_penalty``, ``min_tokens``, ``ignore_eos``,
``stop_token_ids``, ``include_stop_str_in_output``, ``skip_special_tokens``), with
``stream_options``; and the one function turning them into the runtime's
:class:`~transformer_kit.runtime.request_options.RequestOptions`.

Every field may be ``null``, which means its default. The ranges are in the OpenAPI schema, so
a value outside one is refused (400) by name before anything runs.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from transformer_kit.core.errors import InputError
from transformer_kit.runtime.request_options import RequestOptions

#: The most choices (``n``) one request may ask for: each is a request of its own in the
#: engine's queue and a row of its batch, so a larger n is better sent as several requests.
MAX_CHOICES = 16


class StreamOptions(BaseModel):
    """``stream_options``: ``include_usage`` adds a last chunk with the token counts;
    ``continuous_usage_stats`` (vLLM's, with ``include_usage``) puts the counts so far in every
    chunk too."""

    model_config = ConfigDict(extra="forbid")

    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class SamplingFields(BaseModel):
    """The sampling fields both request bodies take (each null: its default)."""

    model_config = ConfigDict(extra="forbid")

    n: int | None = Field(None, ge=1, le=MAX_CHOICES, description=(
        f"Choices to generate (1 to {MAX_CHOICES}); choice i samples with seed + i, so greedy "
        "choices are all alike."))
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0, description=(
        "Subtracted once from every token generated so far (OpenAI's)."))
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0, description=(
        "Subtracted per time a token was generated so far (OpenAI's)."))
    logit_bias: dict[str, Annotated[float, Field(ge=-100.0, le=100.0)]] | None = Field(
        None, description="Token id (as a string) -> a number added to its score (OpenAI's).")
    top_k: int | None = Field(None, ge=-1, description=(
        "Sample among the k most likely tokens; -1 or 0: off (vLLM's)."))
    min_p: float | None = Field(None, ge=0.0, le=1.0, description=(
        "Drop tokens below min_p x the top probability; 0: off (vLLM's)."))
    repetition_penalty: float | None = Field(None, ge=0.01, le=100.0, description=(
        "Tokens of the prompt and the reply so far: positive scores divided by it, negative "
        "ones multiplied (transformers' and vLLM's); 1: off."))
    min_tokens: int | None = Field(None, ge=0, description=(
        "No end id nor stop string ends the reply before this many tokens (vLLM's)."))
    ignore_eos: bool | None = Field(None, description=(
        "Go on past the model's end ids, to max_tokens or a stop (vLLM's)."))
    stop_token_ids: list[Annotated[int, Field(ge=0)]] | None = Field(None, description=(
        "Token ids that end the reply, finish_reason stop (vLLM's)."))
    include_stop_str_in_output: bool | None = Field(None, description=(
        "Keep the stop string (or stop token) the reply ended at in its text (vLLM's)."))
    skip_special_tokens: bool | None = Field(None, description=(
        "False: special tokens are written out in the text (vLLM's; default true)."))


def request_options(fields: SamplingFields) -> RequestOptions:
    """The runtime's options for ``fields`` (null: the default). Raises InputError for a
    ``logit_bias`` key that is not a token id."""
    return RequestOptions(
        presence_penalty=fields.presence_penalty or 0.0,
        frequency_penalty=fields.frequency_penalty or 0.0,
        logit_bias=_token_biases(fields.logit_bias),
        top_k=fields.top_k, min_p=fields.min_p, repetition_penalty=fields.repetition_penalty,
        min_tokens=fields.min_tokens or 0, ignore_eos=bool(fields.ignore_eos),
        stop_token_ids=tuple(fields.stop_token_ids or ()),
        include_stop_str_in_output=bool(fields.include_stop_str_in_output),
        skip_special_tokens=fields.skip_special_tokens is not False)


def _token_biases(given: dict[str, float] | None) -> dict[int, float] | None:
    """``logit_bias`` with its keys read as token ids (JSON's keys are strings, as OpenAI's
    clients send them); the vocabulary is checked where the model is known."""
    if not given:
        return None
    biases = {}
    for key, value in given.items():
        if not (key.isascii() and key.isdigit()):  # int() would take "+5", " 5" and "٥"
            raise InputError(f"logit_bias has the key {key!r}, which is not a token id; give ids as "
                             "strings of digits, e.g. {\"50256\": -100}.")
        biases[int(key)] = value
    return biases


def stream_usage(options: StreamOptions | None, stream: bool) -> tuple[bool, bool]:
    """(include_usage, continuous_usage_stats) of a request; InputError for stream_options
    without stream, or continuous_usage_stats without include_usage (it would do nothing)."""
    if options is None:
        return False, False
    if not stream:
        raise InputError("stream_options is only allowed with stream=true; set stream or leave "
                         "stream_options out.")
    if options.continuous_usage_stats and not options.include_usage:
        raise InputError("stream_options.continuous_usage_stats puts the usage in every chunk, "
                         "which needs include_usage: true; set both, or leave it out.")
    return bool(options.include_usage), bool(options.continuous_usage_stats)
