"""What one request may take, the same in every front-end: a prompt of at most
``max_prompt_tokens`` tokens, audio of at most ``max_audio_seconds`` and at most
``max_request_seconds`` from its arrival to its end (the engine ends it past that). The
front-ends add their own transport's bounds (the HTTP server's body size and API key)."""

from __future__ import annotations

from dataclasses import dataclass

from transformer_kit.core.errors import ContextLengthError, InputError
from transformer_kit.core.speech.audio import MAX_SECONDS

#: The prompt bound when neither the caller nor the export's manifest gives one (no context
#: length known): the engine's ``prefill_tokens`` default, the longest prompt it prefills with others.
DEFAULT_MAX_PROMPT_TOKENS = 4096


@dataclass(frozen=True)
class Limits:
    """What one request may take: a prompt of at most ``max_prompt_tokens`` tokens, audio of at
    most ``max_audio_seconds``, and at most ``max_request_seconds`` (None: no bound) from its
    arrival to its last token (a transcription: to its last window's).
    ``context_length``: the model's, when known (the bound's default, and named in refusals)."""

    max_prompt_tokens: int
    max_request_seconds: float | None = None
    context_length: int | None = None
    max_audio_seconds: float = MAX_SECONDS

    @classmethod
    def of(cls, context_length: int | None, max_prompt_tokens: int | None = None,
           max_request_seconds: float | None = None, max_audio_seconds: float = MAX_SECONDS) -> Limits:
        """The limits of a server over a model of ``context_length``: ``max_prompt_tokens``
        None is that context length, else :data:`DEFAULT_MAX_PROMPT_TOKENS`; a speech model's
        audio at most ``max_audio_seconds`` long. Raises InputError for a bound that is not
        positive."""
        if max_prompt_tokens is not None and max_prompt_tokens < 1:
            raise InputError(f"max_prompt_tokens must be at least 1, got {max_prompt_tokens}.")
        if max_request_seconds is not None and not max_request_seconds > 0:
            raise InputError(f"max_request_seconds must be more than 0 (or None: no bound), got "
                             f"{max_request_seconds}.")
        if not max_audio_seconds > 0:
            raise InputError(f"max_audio_seconds must be more than 0, got {max_audio_seconds}.")
        if max_prompt_tokens is None:
            max_prompt_tokens = context_length or DEFAULT_MAX_PROMPT_TOKENS
        return cls(max_prompt_tokens, max_request_seconds, context_length, max_audio_seconds)

    def check_prompt(self, tokens: int, what: str = "The prompt") -> None:
        """Raise ContextLengthError when a prompt of ``tokens`` tokens is over the bound."""
        if tokens <= self.max_prompt_tokens:
            return
        limit = self.max_prompt_tokens
        if limit == self.context_length:
            bound = f"the model's context length, {limit} tokens"
            fix = f"shorten it: the prompt and max_tokens together must fit in {limit}"
        else:
            bound = f"the {limit} tokens this server takes in a prompt (--max-prompt-tokens)"
            fix = f"shorten it to at most {limit} tokens, or start the server with a larger bound"
            if self.context_length is not None:
                fix += f" (up to the model's context length, {self.context_length})"
        raise ContextLengthError(f"{what} has {tokens} tokens, more than {bound}; {fix}.")
