"""A checkpoint's own sampling defaults: the options its ``generation_config.json`` sets
(``do_sample``, ``temperature``, ``top_p``, ``top_k``, ``min_p``, ``repetition_penalty``), used
by ``generate``, ``stream`` and ``chat`` where a call does not set them, as transformers'
``generate`` and vLLM's ``--generation-config auto`` use them.

How a call's options meet the defaults (:func:`with_defaults`):

- an option the call gives wins; the rest come from the defaults;
- ``temperature=0`` in a call (without ``do_sample=True``) is greedy search, whatever the
  defaults say (OpenAI's and vLLM's meaning); ``do_sample=False`` in a call is greedy too;
- without ``do_sample`` true (given, or in the defaults: transformers' rule, greedy when the file
  does not say ``do_sample``), the defaults' temperature, top_p, top_k and min_p are left out
  (they only shape sampling); ``repetition_penalty`` applies to greedy search as well;
- ``use_generation_defaults=False`` in a call ignores the defaults (the command line's and the
  server's ``--generation-config ignore``).
"""

from __future__ import annotations

import warnings
from typing import Any

from pydantic import ValidationError

from transformer_kit.core.decoding.options import SAMPLING_OPTIONS, GenerationConfig, generation_config

#: The options read from a checkpoint's generation_config.json (vLLM's set, and do_sample).
DEFAULT_OPTIONS = ("do_sample", "temperature", "top_p", "top_k", "min_p", "repetition_penalty")
#: The call keyword that ignores the defaults when False.
USE_DEFAULTS = "use_generation_defaults"
#: The values ``--generation-config`` takes: the checkpoint's defaults (``auto``, as vLLM) or none.
GENERATION_CONFIG_MODES = ("auto", "ignore")


def read_defaults(data: dict[str, Any]) -> dict[str, Any]:
    """The sampling defaults a ``generation_config.json`` object sets: the options of
    :data:`DEFAULT_OPTIONS` it holds with a value the kit takes (a null or a value the kit
    refuses is left out, as transformers leaves an unset option: its default; top_k 0 and
    min_p 0, which turn the filter off, too)."""
    out: dict[str, Any] = {}
    for key in DEFAULT_OPTIONS:
        value = data.get(key)
        if value is None or (key in ("top_k", "min_p") and value == 0):
            continue
        try:
            with warnings.catch_warnings():  # a sampling option alone warns: not the point here
                warnings.simplefilter("ignore")
                GenerationConfig(**{key: value})
        except ValidationError:
            continue
        out[key] = value
    return out


def given_options(config: GenerationConfig | dict | None, options: dict[str, Any]) -> dict[str, Any]:
    """The options a call set: ``config``'s (a GenerationConfig's set fields) under ``options``."""
    if isinstance(config, GenerationConfig):
        base = config.model_dump(exclude_unset=True)
    elif isinstance(config, dict):
        base = dict(config)
    else:
        base = {}
    return {**base, **options}


def with_defaults(defaults: dict[str, Any] | None, given: dict[str, Any]) -> dict[str, Any]:
    """The options a call runs with: ``given`` (the call's) over the checkpoint's ``defaults``,
    by the rules of the module's docstring. ``given`` may hold ``use_generation_defaults``."""
    given = dict(given)
    if not given.pop(USE_DEFAULTS, True):
        defaults = {}
    if given.get("temperature") == 0 and given.get("do_sample") is not True:  # greedy, as OpenAI's 0
        given = {k: v for k, v in given.items() if k not in SAMPLING_OPTIONS}
        given["do_sample"] = False
    merged = {**(defaults or {}), **given}
    if not merged.get("do_sample"):
        for key in SAMPLING_OPTIONS:
            if key not in given:
                merged.pop(key, None)
        if "do_sample" not in given:
            merged.pop("do_sample", None)
    return merged


def call_config(defaults: dict[str, Any] | None, config: GenerationConfig | dict | None,
                options: dict[str, Any]) -> GenerationConfig:
    """The validated options of a call giving ``config`` and keyword ``options`` to a model whose
    checkpoint set ``defaults`` (InputError for a bad option, as ``generation_config``)."""
    return generation_config(None, **with_defaults(defaults, given_options(config, options)))


def describe(options: dict[str, Any]) -> str:
    """The sampling options in effect, in a few words (the command line prints them)."""
    shown = {k: options[k] for k in DEFAULT_OPTIONS if k in options and k != "do_sample"}
    strategy = "sampling" if options.get("do_sample") else "greedy"
    if not options.get("do_sample"):
        shown = {k: v for k, v in shown.items() if k not in SAMPLING_OPTIONS}
    return ", ".join([strategy, *(f"{k} {v:g}" for k, v in shown.items())])
