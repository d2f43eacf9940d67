"""The kit's typed errors. Each message says what was given, what is allowed and what to do."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class TransformerKitError(Exception):
    """Base class of every error the kit raises on purpose."""


class ConfigError(TransformerKitError, ValueError):
    """A model config is malformed: unknown key, wrong type, out-of-range value, impossible mix."""


class UnknownComponentError(ConfigError, KeyError):
    """A component name that no registered plugin provides."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class PluginError(TransformerKitError):
    """A plugin failed: its import, its hook, or a registration conflict. Names the plugin."""


class ComponentError(TransformerKitError):
    """A component's factory raised or returned something that is not the promised interface."""


class MaskError(TransformerKitError, TypeError):
    """A mask of the wrong dtype or shape was given to an attention kernel."""


class InputError(TransformerKitError, ValueError):
    """Model inputs of the wrong dtype, rank, range or length."""


class ExportError(TransformerKitError):
    """An ONNX export failed or did not verify."""


def did_you_mean(given: str, allowed: Iterable[str]) -> str:
    """A ' Did you mean 'x'?' suffix when ``given`` is close to one of ``allowed``, else ''."""
    close = difflib.get_close_matches(given, list(allowed), n=1, cutoff=0.6)
    return f" Did you mean {close[0]!r}?" if close else ""
