"""The tasks a served model does, as every front-end calls them: text in, text deltas, vectors
or scores out, within one set of :class:`~.limits.Limits`.

The HTTP server, Ray Serve's replicas and the Triton model call these and nothing below them
(the command line's one-shot ``generate`` and ``chat`` call :mod:`.one_shot` and
:mod:`.chat_session`): here prompts are tokenized (a chat rendered by the export's template),
checked against the limits, submitted to the :class:`~.engine.Engine` with the request's time
bound, and read back as text (stop strings cut, tool calls parsed), vectors (cut to
``dimensions``, normalised again) or scores. Every method raises InputError (a
ContextLengthError for a prompt over the bound) or :class:`~.engine.QueueFull` before anything
runs; a request that then fails says so in its ``failure``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from transformer_kit.chat.conversation import ChatTurn, reply_budget
from transformer_kit.chat.reasoning import SWITCHES
from transformer_kit.core.decoding.options import GenerationConfig
from transformer_kit.core.decoding.text import TextPieces
from transformer_kit.core.embedding import TextEncoder
from transformer_kit.core.errors import InputError
from transformer_kit.runtime.engine import Engine
from transformer_kit.runtime.limits import Limits
from transformer_kit.runtime.onnx_model import OnnxModel
from transformer_kit.runtime.request_options import RequestOptions
from transformer_kit.runtime.requests import Failure, GenerationRequest, PoolingRequest
from transformer_kit.runtime.text_stream import TextStream
from transformer_kit.runtime.tokenization import detokenize, token_strings, tokenize, tokenizer_info
from transformer_kit.runtime.transcription import Transcribing, prepare
from transformer_kit.tokenizer import TextTokenizer

#: The values a chat template's ``reasoning_effort`` switch takes (gpt-oss's harmony template).
REASONING_EFFORTS = SWITCHES["reasoning_effort"]
#: Inputs per embeddings request by default (OpenAI's limit).
MAX_INPUTS = 2048
#: Documents per rerank request by default (Cohere's recommended most).
MAX_DOCUMENTS = 1000
#: A message's role as OpenAI names it -> as chat templates read it ("developer" is OpenAI's
#: newer name for the system message).
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
#: The measuring encoder's cut: far beyond any model, so a text's full length is seen.
_UNCUT = 1 << 30


def prompt_forms(model: OnnxModel) -> tuple[str, ...]:
    """How a generation prompt may be given to ``model``: token ids always, text with a
    tokenizer, chat messages with a chat template too."""
    tokenizer = model.tokenizer
    if tokenizer is None:
        return ("ids",)
    return ("ids", "text", "messages") if tokenizer.chat_templates else ("ids", "text")


def sampling(temperature: float | None, top_p: float | None, seed: int | None,
             defaults: dict[str, Any] | None = None, extra: RequestOptions | None = None) -> dict[str, Any]:
    """Generation options from OpenAI's sampling fields over the checkpoint's sampling
    ``defaults`` (``OnnxModel.generation_defaults``, as vLLM's ``--generation-config auto``):
    temperature 0 is greedy search; a field left out (None) takes the checkpoint's value, else
    OpenAI's (temperature 1, top_p 1: sampling); the checkpoint's top_k, min_p and
    repetition_penalty apply unless ``extra`` (the request's further options) gives its own. A
    checkpoint whose generation_config.json says ``do_sample: false`` answers greedily unless
    the request gives a temperature. The penalties and the logit bias apply to greedy search
    too; top_k and min_p only shape sampling."""
    defaults, extra = defaults or {}, extra or RequestOptions()
    options: dict[str, Any] = {"seed": seed}
    if extra.repetition_penalty is not None:
        options["repetition_penalty"] = extra.repetition_penalty
    elif "repetition_penalty" in defaults:
        options["repetition_penalty"] = defaults["repetition_penalty"]
    options.update(extra.penalties())
    if temperature == 0 or (temperature is None and defaults.get("do_sample") is False):
        return options
    options.update(do_sample=True,
                   temperature=defaults.get("temperature", 1.0) if temperature is None else temperature,
                   top_p=defaults.get("top_p", 1.0) if top_p is None else top_p)
    options.update(extra.warpers(defaults))
    return options


def _text(content: Any, where: str) -> Any:
    """A message's content as text: a string, or text parts joined by newlines (as vLLM)."""
    if not isinstance(content, list):
        return content
    texts = []
    for i, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise InputError(f"{where}.content[{i}] is a part of type {kind!r}; this server takes "
                             "text only: give content as a string or as parts {'type': 'text', "
                             "'text': ...}.")
        texts.append(part["text"])
    return "\n".join(texts)


def template_messages(messages: list[dict[str, Any]]) -> list[dict]:
    """OpenAI-style messages as a chat template reads them: "developer" as "system", content
    parts joined into text (a tool call's arguments become objects in ``ChatTurn``); fields beyond
    OpenAI's reach the template as transformers passes them. Raises InputError for an empty
    conversation, an unknown role or non-text content."""
    if not messages:
        raise InputError("messages is empty; give the conversation as a list of at least one "
                         "message, e.g. [{'role': 'user', 'content': 'Hello'}].")
    out = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            role = message.get("role") if isinstance(message, dict) else message
            raise InputError(f"{where}.role is {role!r}; a message's role is one of "
                             f"{', '.join(ROLES)}.")
        fields = {key: value for key, value in message.items() if value is not None}
        fields["role"] = ROLES[message["role"]]
        if message.get("content") is not None:
            fields["content"] = _text(message["content"], where)
        elif message["role"] != "assistant":
            raise InputError(f"{where} ({message['role']}) has no content; give its text as "
                             "'content' (only an assistant message with tool_calls may have none).")
        out.append(fields)
    return out


def _l2_normalize(x: np.ndarray) -> np.ndarray:
    """Rows (n, dim) divided by max(their L2 norm, 1e-12), as ``OnnxModel.embed`` does."""
    return (x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)).astype(np.float32)


@dataclass
class Pooled:
    """A submitted embeddings or rerank request: ``request`` (await its ``finished()`` or
    ``wait()`` for it), then :meth:`vectors` or :meth:`ranking`; ``tokens`` counts its inputs'
    tokens (after a pair's cut)."""

    request: PoolingRequest
    tokens: int
    dimensions: int | None = None
    normalizes: bool = False
    top_n: int | None = None

    @property
    def failure(self) -> Failure | None:
        return self.request.failure

    def vectors(self) -> np.ndarray:
        """The request's vectors (n, dimensions or dim), once it ended: cut to ``dimensions``
        and normalised again when the model normalises (as ``OnnxModel.embed(dimensions=...)``)."""
        raw = self.request.rows
        assert raw is not None, "the request has not ended with its rows; see failure"
        if self.dimensions is None:
            return raw
        if self.dimensions > raw.shape[1]:
            raise InputError(f"dimensions is {self.dimensions}, but this model's embeddings have "
                             f"{raw.shape[1]}; give a number from 1 to {raw.shape[1]} or leave it out.")
        cut = np.ascontiguousarray(raw[:, :self.dimensions])
        return _l2_normalize(cut) if self.normalizes else cut

    def scores(self) -> np.ndarray:
        """The documents' relevance scores (n,), in their order, once the request ended."""
        return self.request.rows[:, 0]

    def ranking(self) -> list[tuple[int, float]]:
        """The documents by relevance, best first (ties by position): (index, score), at most
        ``top_n``."""
        scores = self.scores()
        order = sorted(range(len(scores)), key=lambda i: (-float(scores[i]), i))[:self.top_n]
        return [(i, float(scores[i])) for i in order]


class Service:
    """The tasks of the model ``engine`` serves, within ``limits`` (None: prompts of at most
    the model's context length, no time bound).

    Args:
        max_inputs: most inputs in one embeddings request.
        max_documents: most documents in one rerank request.
        generation_defaults: False ignores the checkpoint's sampling defaults (a request's
            missing sampling fields then take OpenAI's).
    """

    def __init__(self, engine: Engine, limits: Limits | None = None, *, max_inputs: int = MAX_INPUTS,
                 max_documents: int = MAX_DOCUMENTS, generation_defaults: bool = True) -> None:
        self.engine, self.model = engine, engine.model
        #: The checkpoint's sampling defaults a request's missing fields take (:func:`sampling`);
        #: {} with ``generation_defaults=False`` (``--generation-config ignore``).
        self.generation_defaults: dict[str, Any] = (
            dict(getattr(self.model, "generation_defaults", None) or {}) if generation_defaults else {})
        self.limits = limits or Limits.of(self.model.context_length)
        self.max_inputs, self.max_documents = max_inputs, max_documents
        self.kind = engine.kind
        if self.kind == "embeddings":
            settings, _ = self.model.embedding_settings()
            #: Inputs' tokens as the model runs them, with no cut: an over-long input is refused.
            self.measuring = TextEncoder(self.model.tokenizer, {**settings, "max_seq_length": _UNCUT}, None)
            self.normalizes = bool((settings.get("sentence_embedding") or {}).get("normalize"))
        if self.kind in ("embeddings", "rerank"):
            #: Most tokens of one input (the model's max_seq_length or positional bound).
            self.max_input_tokens = self.model.sentences.text_encoder.max_tokens

    @property
    def tokenizer(self) -> TextTokenizer | None:
        return self.model.tokenizer

    def close(self) -> None:
        self.engine.close()

    # -- generation -----------------------------------------------------------------------
    def complete(self, prompt: str | list[int], **fields: Any) -> TextStream:
        """Continue ``prompt``: the one choice of :meth:`complete_choices` (its fields)."""
        return self.complete_choices(prompt, 1, **fields)[0]

    def complete_choices(self, prompt: str | list[int], n: int = 1, *, max_tokens: int | None = 16,
                         temperature: float | None = None, top_p: float | None = None,
                         seed: int | None = None, stop: str | list[str] | None = None,
                         prompt_lookup_num_tokens: int | None = None,
                         extra: RequestOptions | None = None) -> list[TextStream]:
        """``n`` continuations of ``prompt`` (text, with the export's tokenizer, or token ids),
        each of at most ``max_tokens`` tokens (None: generation's default, 32); ``extra``: the
        request's further options (the log probability reports among them; ``max_tokens`` 0:
        none, the prompt's report alone). Choice i samples with ``seed + i``, so it is
        ``OnnxModel.generate(..., seed=seed + i)``'s (greedy choices are all alike)."""
        extra = extra or RequestOptions()
        stops = _stops(stop)
        ids = self._prompt_ids(prompt)
        self.limits.check_prompt(len(ids))
        options = sampling(temperature, top_p, seed, self.generation_defaults, extra)
        if max_tokens is not None:
            options["max_new_tokens"] = max_tokens
        if prompt_lookup_num_tokens is not None:
            options["prompt_lookup_num_tokens"] = prompt_lookup_num_tokens
        if stops and self.tokenizer is None:
            raise InputError("stop strings need the model's tokenizer, and this export has none; "
                             "leave stop out.")
        return self._submit(ids, stops, options, extra, n)

    def chat(self, messages: list[dict[str, Any]], **fields: Any) -> TextStream:
        """The assistant's reply to ``messages``: the one choice of :meth:`chat_choices` (its
        fields)."""
        return self.chat_choices(messages, 1, **fields)[0]

    def chat_choices(self, messages: list[dict[str, Any]], n: int = 1, *, max_tokens: int | None = None,
                     temperature: float | None = None, top_p: float | None = None,
                     seed: int | None = None, stop: str | list[str] | None = None,
                     tools: list[dict] | None = None, tool_choice: str | dict | None = None,
                     response_format: dict | None = None, template_kwargs: dict | None = None,
                     prompt_lookup_num_tokens: int | None = None,
                     extra: RequestOptions | None = None) -> list[TextStream]:
        """``n`` replies of the assistant to OpenAI-style ``messages``, rendered once by the
        export's chat template (with ``tools``, ``tool_choice``, ``response_format`` and the
        template's own keyword arguments); ``max_tokens`` None: 256 or the room the context has
        left (:func:`~transformer_kit.chat.conversation.reply_budget`); ``extra`` and the
        seeds as :meth:`complete_choices`."""
        extra = extra or RequestOptions()
        stops = _stops(stop)
        if self.tokenizer is None:
            raise InputError("This export has no tokenizer (no tokenizer.json came with it), so it "
                             "cannot render a chat; export a checkpoint that holds its tokenizer, or "
                             "send token ids to /v1/completions.")
        options = {**sampling(temperature, top_p, seed, self.generation_defaults, extra),
                   "response_format": response_format}
        if prompt_lookup_num_tokens is not None:
            options["prompt_lookup_num_tokens"] = prompt_lookup_num_tokens
        turn = ChatTurn(self.tokenizer, template_messages(messages), tools=tools, tool_choice=tool_choice,
                    template_kwargs=template_kwargs, options=options)
        ids = self.tokenizer.encode([turn.prompt], add_special_tokens=False)[0][0].tolist()
        self.limits.check_prompt(len(ids), "The conversation, rendered by the chat template,")
        if max_tokens is None:  # no room left: the engine refuses it with a sentence
            max_tokens = max(reply_budget(len(ids), self.model.context_length), 1)
        return self._submit(ids, stops, {**turn.options, "max_new_tokens": max_tokens}, extra, n, turn)

    # -- tokenization (vLLM's /tokenize and /detokenize) ------------------------------------
    def tokenize(self, prompt: str | None = None, messages: list[dict[str, Any]] | None = None, *,
                 add_special_tokens: bool | None = None, add_generation_prompt: bool = True,
                 tools: list[dict] | None = None, template_kwargs: dict | None = None,
                 token_strs: bool = False) -> tuple[list[int], list[str | None] | None]:
        """The ids a request with ``prompt`` or OpenAI-style ``messages`` is given, and each
        id's token with ``token_strs`` (:func:`.tokenization.tokenize`)."""
        tokenizer = self._text_tokenizer()
        chat = None if messages is None else template_messages(messages)
        ids = tokenize(tokenizer, prompt, chat, add_special_tokens=add_special_tokens,
                       add_generation_prompt=add_generation_prompt, tools=tools,
                       template_kwargs=template_kwargs)
        return ids, token_strings(tokenizer, ids) if token_strs else None

    def tokenizer_info(self) -> dict[str, Any]:
        """vLLM's ``/tokenizer_info`` of the export's tokenizer (:func:`.tokenization.tokenizer_info`)."""
        return tokenizer_info(self.tokenizer)

    def token_bytes(self, ids: list[int]) -> list[bytes] | None:
        """Each id's bytes as its token writes them (``TextTokenizer.token_bytes``); None for an
        export without a tokenizer."""
        return None if self.tokenizer is None else self.tokenizer.token_bytes(ids)

    def prompt_text(self, prompt: str | list[int]) -> str:
        """A prompt as text: itself, or its ids decoded ('' without a tokenizer)."""
        if isinstance(prompt, str):
            return prompt
        return "" if self.tokenizer is None else self.tokenizer.decode(prompt)

    def chat_template_text(self, tools: list[dict] | None = None) -> str:
        """The chat template a chat with ``tools`` is rendered by ('' without a tokenizer)."""
        return "" if self.tokenizer is None else self.tokenizer.chat_template(None, tools)

    def detokenize(self, tokens: list[int]) -> str:
        """The text of ``tokens`` (InputError for an id outside the model's vocabulary)."""
        return detokenize(self._text_tokenizer(), tokens, self.model.manifest.tgt_vocab)

    def _text_tokenizer(self) -> TextTokenizer:
        if self.tokenizer is None:
            raise InputError("This export has no tokenizer (no tokenizer.json came with it), so it "
                             "cannot tokenize text; export a checkpoint that holds its tokenizer.")
        return self.tokenizer

    def _prompt_ids(self, prompt: Any) -> list[int]:
        """One prompt's token ids from text (with the export's tokenizer) or ids."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise InputError("This export has no tokenizer, so the prompt must be token ids (a "
                                 "list of integers), not text.")
            ids, _ = self.tokenizer.encode([prompt])
            return ids[0].tolist()
        return [int(t) for t in prompt]

    def _submit(self, ids: list[int], stops: list[str], options: dict, extra: RequestOptions,
                n: int, turn: ChatTurn | None = None) -> list[TextStream]:
        """``n`` requests for the prompt ``ids``, choice i seeded ``seed + i``: all queued, or
        none (those queued before a refusal are cancelled)."""
        if not 1 <= n <= self.engine.max_queue:
            raise InputError(f"n is {n}; this server takes from 1 to {self.engine.max_queue} choices "
                             "per request (each is a request in its queue, --max-queue); ask for "
                             "fewer, or send several requests.")
        options = {**self._endings(options, extra), **extra.reports()}
        tokenizer = self.tokenizer
        matcher = (tokenizer.stop_matcher(stops, skip_special_tokens=extra.skip_special_tokens)
                   if stops and tokenizer is not None else None)
        streams: list[TextStream] = []
        try:
            for i in range(n):
                seeded = options if not i or options.get("seed") is None else {
                    **options, "seed": options["seed"] + i}
                request = self.engine.submit(ids, stop_matcher=matcher, prompt_logprobs=extra.prompt_logprobs,
                                             timeout=self.limits.max_request_seconds, **seeded)
                streams.append(TextStream(request, self._pieces(request, stops, extra), len(ids), turn))
        except Exception:
            for stream in streams:
                stream.cancel()
            raise
        return streams

    def _pieces(self, request: GenerationRequest, stops: list[str], extra: RequestOptions
                ) -> TextPieces | None:
        """The reader of ``request``'s text (None without a tokenizer: token ids only)."""
        if self.tokenizer is None:
            return None
        return TextPieces(self.tokenizer, request.options.eos_ids(self.model.manifest.eos_id), stops,
                          min_tokens=extra.min_tokens, keep_stop=extra.include_stop_str_in_output,
                          skip_special_tokens=extra.skip_special_tokens)

    def _endings(self, options: dict, extra: RequestOptions) -> dict:
        """``options`` with the request's ``min_tokens`` and end ids (``ignore_eos``,
        ``stop_token_ids``), checked."""
        options = dict(options)
        if extra.min_tokens:
            most = options.get("max_new_tokens", GenerationConfig.model_fields["max_new_tokens"].default)
            if extra.min_tokens > most:
                raise InputError(f"min_tokens ({extra.min_tokens}) is more than max_tokens ({most}); "
                                 "lower min_tokens or raise max_tokens.")
            options["min_new_tokens"] = extra.min_tokens
        vocab = self.model.manifest.tgt_vocab
        outside = [t for t in extra.stop_token_ids if not 0 <= t < vocab]
        if outside:
            raise InputError(f"stop_token_ids holds {outside[0]}, outside this model's vocabulary of "
                             f"{vocab} ids (0 to {vocab - 1}); give ids below {vocab}.")
        if extra.ignore_eos and options.get("response_format") is not None:
            raise InputError("ignore_eos cannot run with response_format or a forced tool call: the "
                             "grammar ends the reply with the model's end id; leave one of them out.")
        if extra.ignore_eos or extra.stop_token_ids:
            eos = self.model.manifest.eos_id
            ends = [] if extra.ignore_eos or eos is None else [eos] if isinstance(eos, int) else list(eos)
            options["eos_id"] = list(dict.fromkeys([*ends, *extra.stop_token_ids]))
        return options

    # -- pooling --------------------------------------------------------------------------
    def embed(self, inputs: Any, *, dimensions: int | None = None) -> Pooled:
        """Sentence embeddings of ``inputs``: a string, a list of strings, a list of token ids
        or a list of id lists. InputError for an empty, too long or too large one (an input
        longer than the model takes is refused, as OpenAI refuses it, not cut)."""
        self._serves("embeddings")
        items = [inputs] if isinstance(inputs, str) or (inputs and isinstance(inputs[0], int)) else inputs
        if not items:
            raise InputError("input is an empty list; give a string, a list of strings, a list of "
                             "token ids or a list of id lists.")
        if len(items) > self.max_inputs:
            raise InputError(f"input holds {len(items)} inputs; this server takes at most "
                             f"{self.max_inputs} per request. Split them over several requests.")
        empty = [i for i, item in enumerate(items) if not item]
        if empty:
            what = "string" if isinstance(items[empty[0]], str) else "token id list"
            raise InputError(f"input[{empty[0]}] is an empty {what}; every input needs some text "
                             "or ids. Leave it out.")
        encoded, _ = self.measuring.encode(items)
        for i, count in enumerate(encoded.token_counts):
            if count > self.max_input_tokens:
                raise InputError(f"input[{i}] is {count} tokens long; this model takes at most "
                                 f"{self.max_input_tokens} tokens per input. Shorten it or split it.")
        request = self.engine.submit_pooling(encoded.tokens, encoded.pooled,
                                             timeout=self.limits.max_request_seconds)
        return Pooled(request, sum(encoded.token_counts), dimensions, self.normalizes)

    def rerank(self, query: str, documents: list[str], *, top_n: int | None = None) -> Pooled:
        """``documents`` scored against ``query`` by the cross-encoder (a pair longer than the
        model takes is cut longest first, as ``CrossEncoder.predict`` and Cohere cut it).
        InputError for an empty query, no documents, too many, or an empty one."""
        self._serves("rerank")
        if not query.strip():
            raise InputError("query is empty; give the text to rank the documents against.")
        if not documents:
            raise InputError("documents is an empty list; give at least one document to rank.")
        if len(documents) > self.max_documents:
            raise InputError(f"documents holds {len(documents)} documents; this server takes at "
                             f"most {self.max_documents} per request. Split them over several "
                             "requests and merge the rankings by relevance_score.")
        empty = [i for i, d in enumerate(documents) if not d.strip()]
        if empty:
            raise InputError(f"documents[{empty[0]}] is empty; every document needs some text. "
                             "Leave it out.")
        tokens, types = self.model.sentences.text_encoder.encode_pairs(query, documents)
        request = self.engine.submit_pooling(tokens, types, timeout=self.limits.max_request_seconds)
        return Pooled(request, sum(map(len, tokens)), top_n=top_n)

    # -- speech ---------------------------------------------------------------------------
    def transcribe(self, audio: Any, *, name: str | None = None, **options: Any) -> Transcribing:
        """A transcription of ``audio`` (a file's bytes or path, any format FFmpeg reads) by a
        speech model, ready to :meth:`~.transcription.Transcribing.run` (its windows decode in
        the engine's batch with other callers'), within the limits' audio and time bounds;
        ``name`` names the file in refusals; ``options``: the
        :class:`~transformer_kit.core.speech.TranscribeOptions`. Raises InputError (an
        AudioError for the audio) before anything runs."""
        self._serves("transcribe")
        return prepare(self.engine, audio, max_seconds=self.limits.max_audio_seconds, name=name,
                       timeout=self.limits.max_request_seconds, **options)

    def _serves(self, kind: str) -> None:
        if self.kind != kind:
            raise InputError(f"This model serves {self.kind}, not {kind}.")


def _stops(stop: str | list[str] | None) -> list[str]:
    return [stop] if isinstance(stop, str) else list(stop or [])
