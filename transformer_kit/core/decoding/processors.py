"""Logits processors: the registry kind ``logits_processor`` and the pipeline built from options.

A processor changes next-token scores (numpy, ``(rows, vocab)`` float32) before a token is
chosen; it sees every row's tokens so far. The same processors run whatever produced the
scores (PyTorch or onnxruntime), so both runtimes choose alike. Built-ins come from the
``builtin.logits`` plugin; a third-party plugin registers more under the same kind.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from transformer_kit.core.decoding.options import GenerationConfig
from transformer_kit.core.decoding.response_format import grammar_of

#: Factory context of the ``logits_processor`` kind: the factory takes the ones it names.
#: vocab_size (int), eos_ids (list[int]), num_beams (int), min_tokens_to_keep (int),
#: tokenizer (the model's ``TextTokenizer`` or None), max_new_tokens (int), do_sample (bool).
KIND = "logits_processor"


@dataclass
class DecodingState:
    """What processors may look at.

    ids: (rows, length) int64, each row's prompt (left-padded) and the tokens chosen so far;
        for encoder-decoder models the decoder's tokens (start token first).
    real: (rows, length) bool, True for real tokens (False for padding).
    prompt_length: how many leading columns of ``ids`` are the prompt.
    generated: the tokens generated so far when ``ids`` and ``real`` hold the prompt alone
        (the state a pipeline gets when none of its processors reads tokens), else None.
    """

    ids: np.ndarray
    real: np.ndarray
    prompt_length: int
    generated: int | None = None

    @property
    def keep(self) -> np.ndarray:
        """:attr:`real` under the name processors written for earlier versions read."""
        return self.real

    @property
    def new_tokens(self) -> int:
        """Tokens generated so far (the same in every row)."""
        if self.generated is not None:
            return self.generated
        return self.ids.shape[1] - self.prompt_length


class LogitsProcessor:
    """``processor(scores, state) -> scores``: scores (rows, vocab) float32, -inf = never chosen.

    Return a new array or change ``scores`` in place and return it.
    """

    #: Whether the processor reads ``state.ids`` or ``state.real``. When no processor of a
    #: pipeline does (only ``new_tokens``: min_new_tokens alone, the sampling warpers), the
    #: decoding loop keeps no history of the tokens, which spares every token its upkeep. A
    #: plain callable counts as one that reads them.
    reads_tokens: bool = True

    def __call__(self, scores: np.ndarray, state: DecodingState) -> np.ndarray:  # pragma: no cover
        raise NotImplementedError


class Pipeline:
    """Processors applied in order: ``pipeline(scores, state) -> scores``, scores (rows, vocab)
    float32 the caller's own (changed in place); empty (len 0) for plain greedy or sampling."""

    def __init__(self, processors: list[Callable[[np.ndarray, DecodingState], np.ndarray]]) -> None:
        self.processors = list(processors)

    def __call__(self, scores: np.ndarray, state: DecodingState) -> np.ndarray:
        for processor in self.processors:
            scores = processor(scores, state)
        return scores

    def __len__(self) -> int:
        return len(self.processors)

    @property
    def reads_tokens(self) -> bool:
        """Whether a processor reads the tokens so far (see ``LogitsProcessor.reads_tokens``)."""
        return any(getattr(p, "reads_tokens", True) for p in self.processors)


def _specs(options: GenerationConfig, eos_ids: list[int], forced_bos_id: int | None
           ) -> list[tuple[str, dict]]:
    """The built-in processors the options ask for, in Hugging Face's order: the logit bias
    (transformers' sequence_bias comes first too), penalties (repetition, then presence and
    frequency, as vLLM applies them), then the user's processors, then (sampling only) the
    distribution warpers."""
    specs: list[tuple[str, dict]] = []
    if options.logit_bias:
        specs.append(("logit_bias", {"bias": dict(options.logit_bias)}))
    if options.repetition_penalty != 1.0:
        specs.append(("repetition_penalty", {"penalty": options.repetition_penalty}))
    if options.presence_penalty or options.frequency_penalty:
        specs.append(("presence_frequency_penalty", {"presence": options.presence_penalty,
                                                     "frequency": options.frequency_penalty}))
    if options.no_repeat_ngram_size > 0:
        specs.append(("no_repeat_ngram", {"size": options.no_repeat_ngram_size}))
    if options.min_new_tokens > 0 and eos_ids:
        specs.append(("min_new_tokens", {"count": options.min_new_tokens}))
    if forced_bos_id is not None:
        specs.append(("forced_bos", {"token_id": forced_bos_id}))
    specs.extend((spec.name, dict(spec.params)) for spec in options.logits_processors)
    grammar = grammar_of(options.response_format)
    if grammar is not None:  # before the warpers: they keep only tokens the grammar allows
        specs.append(("grammar", {"grammar": grammar}))
    specs.extend(_warpers(options))
    return specs


def _warpers(options: GenerationConfig) -> list[tuple[str, dict]]:
    """The distribution warpers the options ask for, in Hugging Face's order (none without
    sampling): temperature, top-k, top-p, min-p."""
    if not options.do_sample:
        return []
    warpers: list[tuple[str, dict]] = []
    if options.temperature != 1.0:
        warpers.append(("temperature", {"value": options.temperature}))
    if options.top_k:
        warpers.append(("top_k", {"k": options.top_k}))
    if options.top_p < 1.0:
        warpers.append(("top_p", {"p": options.top_p}))
    if options.min_p is not None:
        warpers.append(("min_p", {"p": options.min_p}))
    return warpers


def build_pipeline(options: GenerationConfig, vocab_size: int, eos_ids: list[int],
                   registry=None, forced_bos_id: int | None = None,
                   tokenizer: Any = None) -> tuple[list[str], Pipeline]:
    """The processors ``options`` ask for, created from the registry, as one callable
    (``forced_bos_id``: the model's first forced token, when ``options`` names none;
    ``tokenizer``: the model's ``TextTokenizer``, for processors that read text).

    Returns their names (in order) and ``pipeline(scores, state) -> scores``.
    """
    forced = options.forced_bos_id if options.forced_bos_id is not None else forced_bos_id
    specs = _specs(options, eos_ids, forced)
    if specs and registry is None:  # no registry (nor plugins, nor torch) for plain greedy/beams
        from transformer_kit.core.registry import get_registry
        registry = get_registry()
    keep = 1
    if options.num_beams > 1 and options.do_sample:  # a beam needs a non-eos continuation
        keep = len(eos_ids) + 1
    context = {"vocab_size": vocab_size, "eos_ids": list(eos_ids), "num_beams": options.num_beams,
               "min_tokens_to_keep": keep, "tokenizer": tokenizer,
               "max_new_tokens": options.max_new_tokens, "do_sample": options.do_sample}
    processors = [registry.create(KIND, name, context=context, **params) for name, params in specs]
    return [name for name, _ in specs], Pipeline(processors)
