"""Calibration for 4-bit weights: how large each product's inputs are, column by column.

A block's rounding error matters in proportion to the inputs it multiplies: an error in a
column whose inputs are large moves the product more than one whose inputs are near zero. So
``Int4(rounding="search")`` weighs each column's squared error by that column's mean squared
input over a calibration text (llama.cpp's importance matrix, ``imatrix``): the model runs once
over the text in PyTorch (float32), and a hook on every ``nn.Linear`` sums its inputs' squares.

The text: the one the user gives (``Int4(calibration=...)``: a string, a UTF-8 file, or token
ids), else :data:`DEFAULT_TEXT`, a few pages of mixed prose, dialogue, code and data shipped
with the kit; a model without a tokenizer reads seeded random ids instead. On SmolLM2-135M the
text mattered little (BENCHMARKS.md): what the weighting finds is mostly which hidden channels
carry large activations, a property of the model. A model whose encoder reads features (speech)
is not calibrated: the kit has no speech to run it on, and the features of noise weighed its
columns wrongly (:func:`calibration_for`).

Shapes: ids (windows, window) int64; importance (K,) float32 per weight of shape (N, K).
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from torch import nn

from transformer_kit.core.errors import InputError
from transformer_kit.export.quantize import DEFAULT_TOKENS, Int4
from transformer_kit.export.verify import reference
from transformer_kit.export.weight_writer import weight_source

#: The text calibrated on when the user gives none.
DEFAULT_TEXT = Path(__file__).with_name("calibration.txt")
#: The longest window of text (the model's context length, if shorter); the windows run as one
#: batch.
WINDOW = 512
#: Added to every column's importance, as a share of the row's mean: a column whose inputs
#: were near zero in the text still counts a little (its inputs need not be zero elsewhere).
FLOOR = 0.01


def calibration_ids(model: nn.Module, calibration: str | Path | tuple[int, ...]) -> np.ndarray:
    """(tokens,) int64 ids to calibrate ``model`` on: ``calibration`` tokenized (the default
    text's first :data:`DEFAULT_TOKENS` tokens), or seeded random ids for the default when the
    model has no tokenizer."""
    vocab = min(v for v in (model.config.vocab_size, model.config.src_vocab_size,
                            model.config.tgt_vocab_size) if v)
    if isinstance(calibration, tuple):
        ids = np.asarray(calibration, np.int64)
        if not len(ids) or ids.min() < 0 or ids.max() >= vocab:
            raise InputError(f"Int4 calibration ids must be 1 or more ids in 0..{vocab - 1} (the "
                             f"model's vocabulary); got {len(ids)} ids"
                             + (f" from {ids.min()} to {ids.max()}" if len(ids) else "") + ".")
        return ids
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is None:
        if calibration != "default":
            raise InputError("Int4 calibration text needs the model's tokenizer, and this model has "
                             "none: give token ids (calibration=(5, 17, ...)), or leave calibration "
                             "out (random ids are used).")
        return np.random.default_rng(0).integers(0, vocab, DEFAULT_TOKENS)
    text = DEFAULT_TEXT if calibration == "default" else calibration
    if isinstance(text, Path):
        text = text.read_text(encoding="utf-8")
    ids = tokenizer.encode([text], add_special_tokens=False)[0][0]
    if ids.max() >= vocab:
        raise InputError(f"The model's tokenizer gives ids up to {ids.max()} for the calibration text, "
                         f"beyond the model's {vocab} tokens; give token ids, or calibration=None.")
    return ids[:DEFAULT_TOKENS] if calibration == "default" else ids


def calibration_for(model: nn.Module, quantize: str | Int4 | None) -> str | Int4 | None:
    """``quantize`` as ``model`` is calibrated: an :class:`Int4` without calibration (every
    column alike) for a model whose encoder reads features, where the default asks for it;
    refused where a text or ids are given for one. Other quantizations are returned as given.

    There is no speech to run such a model on at export time, and its encoder (and the
    decoder's cross attention, reading the encoder) would weigh columns by the features of
    noise: on Whisper tiny.en's real weights that weighting cost int4 1.8 points of word error
    rate over uncalibrated blocks (BENCHMARKS.md, "speech to text").
    """
    if (not isinstance(quantize, Int4) or not getattr(model, "takes_features", False)
            or quantize.calibration is None):
        return quantize
    if quantize.calibration != "default":
        raise InputError("Int4 calibration runs a text through the model, and this model's encoder "
                         "reads audio features, which the kit would have to make up (noise weighs "
                         "its columns wrongly): leave calibration out, or give calibration=None.")
    return replace(quantize, calibration=None)


def _windows(ids: np.ndarray, window: int) -> list[np.ndarray]:
    """``ids`` cut into windows of ``window`` tokens; a shorter last one is left out unless it
    is the only one (so that no window is padded: padding's inputs would count)."""
    pieces = [ids[start:start + window] for start in range(0, len(ids), window)]
    return pieces[:-1] if len(pieces) > 1 and len(pieces[-1]) < window else pieces


class _HeadReached(Exception):
    """Raised when the output head's input is recorded: its product is not needed."""


def _run(model: nn.Module, ids: torch.Tensor) -> None:
    """One forward pass over ``ids`` (windows, window), every token real, up to the head."""
    real = torch.ones_like(ids)
    try:
        if model.architecture == "encoder_decoder":
            model(ids, ids, attention_mask=real)
        else:
            model(ids, attention_mask=real)
    except _HeadReached:
        pass


def input_importance(model: nn.Module, ids: np.ndarray,
                     progress: Callable[[int, int], None] | None = None) -> dict[str, np.ndarray]:
    """Each linear layer's mean squared input per column over ``ids`` (tokens,), plus
    :data:`FLOOR` of its mean: {weight name: (K,) float32}, under every name of a tied weight.
    The model runs in float32 as the export's reference does (a streamed model reads each
    layer's weights as it runs), every window in one pass (each layer's weights read once);
    ``progress(done, total)`` after each layer."""
    window = min(WINDOW, model.context_length or WINDOW)
    batch = np.stack(_windows(ids, window))  # (windows, window)
    names: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    sums: dict[str, torch.Tensor] = {}
    counts: dict[str, int] = {}
    owners: dict[str, list[str]] = {}
    hooks = []

    head = getattr(model, "head", None)

    def record(module: nn.Module, inputs: tuple, key: str) -> None:
        x = inputs[0].detach().reshape(-1, inputs[0].shape[-1]).double()
        sums[key] = sums.get(key, 0) + (x * x).sum(0)
        counts[key] = counts.get(key, 0) + len(x)
        if module is head:  # the last product: (tokens, vocab) logits and the head's weights spared
            raise _HeadReached

    for module_name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            key = f"{module_name}.weight"
            owners[key] = names.get(id(module.weight), [key])
            hooks.append(module.register_forward_pre_hook(lambda m, i, key=key: record(m, i, key)))
    layers = [layer for stack in ("encoder", "decoder") if hasattr(model, stack)
              for layer in getattr(model, stack).layers]
    done = iter(range(1, len(layers) + 1))
    if progress is not None:
        hooks += [layer.register_forward_hook(lambda *_: progress(next(done), len(layers)))
                  for layer in layers]
    try:
        with torch.no_grad(), reference(model, weight_source(model)):
            _run(model, torch.from_numpy(batch))
    finally:
        for hook in hooks:
            hook.remove()
        _return_freed_memory()
    importance = {}
    for key, total in sums.items():
        mean = (total / counts[key]).float().numpy()
        for name in owners[key]:
            importance[name] = mean + FLOOR * float(mean.mean())
    return importance


def _return_freed_memory() -> None:
    """Give the heap's freed pages back to the system: glibc keeps them after the weights read
    for calibration are dropped, and the export's writing would then grow the heap anew, raising
    the export's peak. A no-op where there is no glibc."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def calibrate(model: nn.Module, int4: Int4,
              progress: Callable[[str, int, int], None]) -> dict[str, np.ndarray]:
    """``Int4``'s importance for ``model`` ({} without calibration), ``progress(step, done,
    total)`` as the export reports it."""
    if int4.calibration is None:
        return {}
    model.eval()  # no dropout while measuring (the export restores the mode)
    ids = calibration_ids(model, int4.calibration)
    return input_importance(model, ids,
                            lambda done, total: progress("calibrating 4-bit weights", done, total))
