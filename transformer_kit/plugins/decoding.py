"""The built-in plugin ``builtin.decoding``: the logits processors decoding builds from a call's
options (penalties, sampling warpers, a response format's grammar), numpy and llguidance only, so
that an export decodes with every option where torch is not installed."""

from __future__ import annotations

from transformer_kit import Component, hookimpl
from transformer_kit.plugins.grammar import GrammarConstraint
from transformer_kit.plugins.logits import (
    ForcedFirstToken,
    LogitBias,
    MinNewTokens,
    MinP,
    NoRepeatNGram,
    PresenceFrequencyPenalty,
    RepetitionPenalty,
    SuppressAtBegin,
    SuppressTokens,
    Temperature,
    TopK,
    TopP,
)
from transformer_kit.plugins.timestamp_rules import TimestampRules

_LOGITS_PROCESSORS = [
    Component("logits_processor", "repetition_penalty", RepetitionPenalty,
              description="tokens already in the row: positive scores / penalty, negative x penalty"),
    Component("logits_processor", "presence_frequency_penalty", PresenceFrequencyPenalty,
              description="OpenAI's penalties over the generated tokens: `presence` once, "
              "`frequency` per occurrence, subtracted"),
    Component("logits_processor", "logit_bias", LogitBias,
              description="`bias` (token id -> number) added to the scores (OpenAI's logit_bias)"),
    Component("logits_processor", "no_repeat_ngram", NoRepeatNGram,
              description="bans the token that would repeat an n-gram of `size`"),
    Component("logits_processor", "min_new_tokens", MinNewTokens,
              description="no end-of-sequence id before `count` new tokens"),
    Component("logits_processor", "forced_bos", ForcedFirstToken,
              description="the first new token is `token_id` (BART's forced_bos_token_id)"),
    Component("logits_processor", "suppress_tokens", SuppressTokens,
              description="`token_ids` are never chosen (Whisper's suppress_tokens)"),
    Component("logits_processor", "suppress_at_begin", SuppressAtBegin,
              description="`token_ids` are never the first new token (Whisper's "
              "begin_suppress_tokens)"),
    Component("logits_processor", "whisper_timestamps", TimestampRules,
              description="Whisper's timestamp rules: a timestamp first, in pairs, never "
              "decreasing, chosen where timestamps outweigh the best text token"),
    Component("logits_processor", "temperature", Temperature,
              description="scores / `value` (sampling)"),
    Component("logits_processor", "top_k", TopK, description="keeps the `k` best scores (sampling)"),
    Component("logits_processor", "top_p", TopP,
              description="keeps the most likely tokens holding probability `p` (sampling)"),
    Component("logits_processor", "grammar", GrammarConstraint,
              description="holds each row to an llguidance grammar (response_format)"),
    Component("logits_processor", "min_p", MinP,
              description="drops tokens below `p` x the top probability (sampling)"),
]


@hookimpl
def transformer_kit_components() -> list[Component]:
    return list(_LOGITS_PROCESSORS)
