"""Which keyword arguments a component's factory gets: the model sizes it names, plus the
config's parameters for it, every one of which it must accept."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from transformer_kit.core.errors import ConfigError, did_you_mean


def bind_factory_arguments(factory: Callable[..., Any], label: str, context: dict[str, Any],
                           params: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments for ``factory``: the ``context`` entries (model sizes) it names,
    then ``params`` (the config's); raises :class:`ConfigError` naming ``label`` for a
    parameter the factory does not take or one the model config sets."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # builtins without a signature: pass the params only
        return params
    accepted = signature.parameters
    open_ended = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values())
    user_params = [n for n in accepted if n not in context]
    for key in params:
        if key in context:
            raise ConfigError(
                f"{label}: parameter {key!r} is set by the model config, not per component; "
                f"set the top-level key {key!r} instead."
            )
        if key not in accepted and not open_ended:
            raise ConfigError(
                f"{label} got unknown parameter {key!r}.{did_you_mean(key, user_params)} "
                f"It accepts: {', '.join(user_params) or '(no parameters)'}."
            )
    kwargs = {k: v for k, v in context.items() if k in accepted}
    kwargs.update(params)
    try:
        signature.bind(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"{label}: {exc}.") from exc
    return kwargs
