"""Generation for PyTorch models: a :class:`~transformer_kit.core.decoding.Stepper` over the model's
cached (or, as the reference, uncached) decoding steps, driven by the shared strategies of
:mod:`transformer_kit.core.decoding` (greedy, sampling, beam search, streaming)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch import Tensor

from transformer_kit.core.decoding import (
    DecodingCall,
    GenerationConfig,
    generate_tokens,
    stream_tokens,
    text,
)
from transformer_kit.core.decoding.defaults import call_config
from transformer_kit.core.decoding.logprobs import Generation, row_reports
from transformer_kit.core.decoding.prompts import check_source_inputs, check_stop, prepare_call
from transformer_kit.core.errors import ConfigError, InputError
from transformer_kit.core.inputs import check_features, check_token_ids
from transformer_kit.core.interfaces import LayerCache


def _logits(x: Tensor) -> np.ndarray:
    return x.detach().float().cpu().numpy()


def _take(caches: list[LayerCache] | None, rows: Tensor) -> None:
    """Reorder every cached tensor's rows in place of the list: (batch, ...) -> (len(rows), ...)."""
    for cache in caches or []:
        cache.key, cache.value = cache.key[rows], cache.value[rows]
        if cache.cross_key is not None:
            cache.cross_key, cache.cross_value = cache.cross_key[rows], cache.cross_value[rows]


class DecoderStepper:
    """Decoder-only steps: the prompt (batch, len) with ``real``, then one token per row."""

    def __init__(self, model, ids: Tensor, real: Tensor, use_cache: bool) -> None:
        self.model, self.ids, self.real, self.use_cache = model, ids, real, use_cache
        like = torch.empty(0, dtype=model.head.weight.dtype, device=ids.device)  # weights may be streamed
        self.caches = model.new_cache(ids.shape[0], like) if use_cache else None

    def first(self) -> np.ndarray:
        return _logits(self.model.step(self.ids, self.real, self.caches, last_only=True)[:, -1])

    def next(self, tokens: np.ndarray, rows: np.ndarray | None) -> np.ndarray:
        token = torch.from_numpy(tokens).to(self.ids.device)[:, None]
        if rows is not None:
            index = torch.from_numpy(rows).to(self.ids.device)
            self.ids, self.real = self.ids[index], self.real[index]
            _take(self.caches, index)
        self.real = torch.cat([self.real, self.real.new_ones(len(token), 1)], 1)
        self.ids = torch.cat([self.ids, token], 1)
        new = token if self.use_cache else self.ids  # the reference recomputes everything
        return _logits(self.model.step(new, self.real, self.caches, last_only=True)[:, -1])

    #: Several positions' logits in one step (speculative decoding).
    verifies = True

    def verify(self, tokens: np.ndarray) -> np.ndarray:
        """Append ``tokens`` (n,) int64 to the one row in one step: logits (n, vocab), row j
        the next-token logits after ``tokens[j]``."""
        new = torch.from_numpy(tokens).to(self.ids.device)[None]
        self.real = torch.cat([self.real, self.real.new_ones(1, new.shape[1])], 1)
        self.ids = torch.cat([self.ids, new], 1)
        length = self.ids.shape[1]
        start = length - new.shape[1] if not self.use_cache else 0
        positions = torch.arange(start, start + new.shape[1], device=self.ids.device)
        return _logits(self.model.step(new if self.use_cache else self.ids, self.real, self.caches,
                                       positions=positions)[0])

    def drop(self, count: int) -> None:
        """Forget the last ``count`` tokens (rejected drafts): masked out, never attended to."""
        self.real = self.real.clone()
        self.real[:, self.real.shape[1] - count:] = False


class EncoderDecoderStepper:
    """Encoder-decoder steps: the source (token ids, or a frontend's features) encoded once,
    the target from ``start`` (batch, k): ``bos_id``, or a decoder prompt."""

    def __init__(self, model, source: Tensor, src_real: Tensor, use_cache: bool, start: Tensor) -> None:
        self.model, self.use_cache = model, use_cache
        self.memory, self.src_real = model.encode(source, src_real)
        self.caches = model.new_cache(source.shape[0], self.memory) if use_cache else None
        self.tgt = start

    def _decode(self, new: Tensor) -> np.ndarray:
        return _logits(self.model.decode(new, self.memory, self.src_real, self.caches,
                                         last_only=True)[:, -1])

    def first(self) -> np.ndarray:
        return self._decode(self.tgt)

    def next(self, tokens: np.ndarray, rows: np.ndarray | None) -> np.ndarray:
        token = torch.from_numpy(tokens).to(self.tgt.device)[:, None]
        if rows is not None:
            index = torch.from_numpy(rows).to(self.tgt.device)
            self.tgt, self.memory, self.src_real = self.tgt[index], self.memory[index], self.src_real[index]
            _take(self.caches, index)
        self.tgt = torch.cat([self.tgt, token], 1)
        return self._decode(token if self.use_cache else self.tgt)


def _plan(model, ids: Tensor, attention_mask: Any, options: GenerationConfig, use_cache: bool,
          stop_matcher=None, assistant=None, decoder_prompt: Any = None) -> tuple[Any, DecodingCall, Any]:
    """Check the call; the stepper, the call for the shared strategies, the processors."""
    cfg = model.config
    check_stop(options, stop_matcher)
    if model.architecture == "encoder":
        raise InputError("generate needs a decoder; this model's architecture is 'encoder'.")
    if use_cache and model.uncacheable:
        raise InputError(
            f"{', '.join(model.uncacheable)} does not support the key/value cache, so cached "
            "decoding would not match the model; call generate(..., use_cache=False)."
        )
    is_decoder = model.architecture == "decoder"
    if not is_decoder and cfg.bos_id is None:
        raise ConfigError("bos_id is null, but encoder_decoder decoding starts from bos_id; set "
                          "bos_id in the config (for a checkpoint: tk.from_hf(folder, bos_id=...)).")
    features = not is_decoder and model.takes_features
    check_source_inputs(decoder=is_decoder, features=features, attention_mask=attention_mask,
                        decoder_prompt=decoder_prompt)
    ids, token_ids = _checked_source(model, ids, is_decoder)
    call, pipeline, real = prepare_call(
        token_ids, attention_mask, options, decoder=is_decoder, pad_id=None if features else cfg.pad_id,
        eos_id=cfg.eos_id, bos_id=cfg.bos_id, vocab=cfg.tgt_vocab,
        context_length=model.context_length, stop_matcher=stop_matcher,
        forced_bos_id=cfg.forced_bos_id, tokenizer=getattr(model, "tokenizer", None),
        decoder_prompt=decoder_prompt)
    real_tensor = torch.from_numpy(real).to(ids.device)
    if is_decoder:
        prompt = torch.from_numpy(call.prompt_ids).to(ids.device)
        if assistant is not None:
            call.assistant = _assistant_stepper(model, assistant, prompt, real_tensor)
        return DecoderStepper(model, prompt, real_tensor, use_cache), call, pipeline
    if assistant is not None:
        call.assistant = assistant  # refused with a sentence: an encoder-decoder cannot check drafts
    start = torch.from_numpy(call.prompt_ids).to(ids.device)
    return EncoderDecoderStepper(model, ids, real_tensor, use_cache, start), call, pipeline


def _checked_source(model, ids: Any, is_decoder: bool) -> tuple[Tensor, np.ndarray]:
    """The checked prompt or source, and its token ids as numpy ((batch, 0) for features: no
    token ids, every output of the frontend real)."""
    cfg = model.config
    if not is_decoder and model.takes_features:
        features = check_features(ids, model.src_embed.frontend)
        return features, np.zeros((len(features), 0), np.int64)
    name = "input_ids" if is_decoder else "src_ids"
    ids = check_token_ids(ids, cfg.vocab_size if is_decoder else cfg.src_vocab, name)
    return ids, ids.cpu().numpy()


def _assistant_stepper(model, assistant, prompt: Tensor, real: Tensor) -> DecoderStepper:
    """``assistant``'s cached stepper over the same prompt, once it can draft for ``model``."""
    if getattr(assistant, "architecture", None) != "decoder" or not hasattr(assistant, "new_cache"):
        raise InputError("assistant_model must be a decoder TransformerModel, got "
                         f"{type(assistant).__name__}.")
    if assistant.config.vocab_size != model.config.vocab_size:
        raise InputError(f"The assistant model's vocabulary has {assistant.config.vocab_size} tokens and "
                         f"this model's {model.config.vocab_size}; an assistant drafts with the same "
                         "tokenizer: choose one of the same family.")
    assistant.eval()
    return DecoderStepper(assistant, prompt, real, use_cache=True)


def generate(model, ids: Tensor, *, attention_mask: Any = None,
             config: GenerationConfig | dict | None = None, use_cache: bool = True,
             stop_matcher=None, add_special_tokens: bool = True, assistant_model=None,
             decoder_input_ids: Any = None,
             **options: Any) -> Tensor:
    """New tokens for each prompt (see ``TransformerModel.generate``); (rows, steps) int64.
    Text prompts are encoded with the tokenizer's special tokens unless ``add_special_tokens``
    is False (a rendered chat holds its own). ``assistant_model``: a smaller decoder with the
    same vocabulary that drafts tokens (speculative decoding; it is put in eval mode).
    ``decoder_input_ids``: an encoder-decoder's target prompt, (k,) or (rows, k)."""
    opts = call_config(getattr(model, "generation_defaults", None), config, options)
    prompts = text.as_prompts(ids)
    if prompts is not None:
        tokenizer, (ids, attention_mask) = _encoded(model, prompts[0], add_special_tokens)
        tokens = generate(model, ids, attention_mask=attention_mask, config=opts, use_cache=use_cache,
                          stop_matcher=tokenizer.stop_matcher(opts.stop) if opts.stop else None,
                          assistant_model=assistant_model, decoder_input_ids=decoder_input_ids,
                          use_generation_defaults=False)  # opts holds them already
        tokens, reports = tokens if opts.logprobs is not None else (tokens, None)
        out = text.row_texts(tokenizer, tokens.cpu().numpy(), opts.eos_ids(model.config.eos_id),
                             opts.stop, reports)
        return out[0] if prompts[1] and len(out) == 1 else out
    with eval_mode(model):
        stepper, call, pipeline = _plan(model, ids, attention_mask, opts, use_cache, stop_matcher,
                                        assistant_model, decoder_input_ids)
        tokens = generate_tokens(stepper, call, opts, pipeline)
    out = torch.from_numpy(tokens).to(ids.device)
    return out if opts.logprobs is None else Generation(out, row_reports(call.logprobs, len(tokens)))


def stream(model, ids: Tensor, *, attention_mask: Any = None,
           config: GenerationConfig | dict | None = None, use_cache: bool = True,
           stop_matcher=None, add_special_tokens: bool = True, assistant_model=None,
           decoder_input_ids: Any = None,
           **options: Any) -> Iterator[Tensor]:
    """Each step's tokens (rows,) int64 as they are chosen (greedy search or sampling).

    The call is checked at once; each step runs in eval mode and restores the model's mode."""
    opts = call_config(getattr(model, "generation_defaults", None), config, options)
    if opts.num_beams > 1:
        raise InputError("stream yields tokens as they are chosen, but beam search chooses them "
                         f"only at the end (num_beams={opts.num_beams}); call generate instead.")
    prompts = text.as_prompts(ids)
    if prompts is not None:
        tokenizer, (ids, attention_mask) = _encoded(model, prompts[0], add_special_tokens)
        stop_matcher = tokenizer.stop_matcher(opts.stop) if opts.stop else None
    with eval_mode(model):
        stepper, call, pipeline = _plan(model, ids, attention_mask, opts, use_cache, stop_matcher,
                                        assistant_model, decoder_input_ids)
    steps = _steps(model, stream_tokens(stepper, call, opts, pipeline), ids.device)
    if prompts is None:
        return steps
    rows = len(ids) * opts.num_return_sequences
    return text.stream_text(tokenizer, (s.cpu().numpy() for s in steps), rows,
                            opts.eos_ids(model.config.eos_id), opts.stop,
                            prompts[1] and rows == 1)


def _encoded(model, prompts: list[str], add_special_tokens: bool):
    """The model's tokenizer and the prompts as ids and attention mask tensors."""
    tokenizer = text.require(getattr(model, "tokenizer", None), "This model")
    ids, real = tokenizer.encode(prompts, add_special_tokens)
    device = next(model.parameters()).device
    return tokenizer, (torch.from_numpy(ids).to(device), torch.from_numpy(real).to(device))


def _steps(model, steps: Iterator[np.ndarray], device: torch.device) -> Iterator[Tensor]:
    while True:
        with eval_mode(model):
            token = next(steps, None)
        if token is None:
            return
        yield torch.from_numpy(token).to(device)


@contextlib.contextmanager
def eval_mode(model):
    """Eval mode without gradients for the block, then the model's mode as it was."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)
