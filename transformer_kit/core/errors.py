"""The kit's typed errors, one meaning each. Each message says what was given, what is allowed
and what to do.

=====================  ========================================================================
error                  means
=====================  ========================================================================
ConfigError            a model config is malformed, impossible, or too large to build
UnknownComponentError  a config names a component no registered plugin provides (a ConfigError)
PluginError            a plugin failed: its import, its hook, or a registration conflict
ComponentError         a component's factory raised or returned the wrong interface
MaskError              an attention kernel got a mask of the wrong dtype or shape
InputError             a call's arguments: token ids of the wrong dtype, rank, range or length,
                       or an option outside what is allowed (max_new_tokens, dtype, providers ...)
ChatTemplateError      a chat template cannot render a conversation: none, it refused it, or it
                       broke the sandbox's rules or limits (an InputError)
ContextLengthError     a prompt longer than the model's context (with max_new_tokens) or than a
                       server's bound on prompts (an InputError)
CheckpointError        a checkpoint folder (Hugging Face or ``model.save``) cannot be read or
                       converted
ExportError            an ONNX export failed or did not verify
ArtifactError          an export folder cannot be loaded: missing, another format or version, or
                       damaged files
ProviderError          an onnxruntime execution provider that was asked for cannot run here
DependencyError        the work needs an extra that is not installed (torch, to build or export
                       a model): its install command
=====================  ========================================================================
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class TransformerKitError(Exception):
    """Base class of every error the kit raises on purpose; never raised itself."""


class ConfigError(TransformerKitError, ValueError):
    """A model config is malformed: unknown key, wrong type, out-of-range value, impossible mix,
    or weights larger than the machine can hold."""


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
    """A call's arguments: ids of the wrong dtype, rank, range or length, or a bad option."""


class ChatTemplateError(InputError):
    """A chat template that cannot render a conversation: the model has none, it refused the
    conversation (its own ``raise_exception``), broke the sandbox's rules, or passed a limit."""


class ContextLengthError(InputError):
    """A prompt that does not fit: with ``max_new_tokens`` beyond the model's context length, or
    longer than a server's bound on prompt tokens (OpenAI's ``context_length_exceeded``)."""


class CheckpointError(TransformerKitError):
    """A checkpoint folder (Hugging Face, or saved with ``model.save``) that cannot be read or
    converted."""


class ExportError(TransformerKitError):
    """An ONNX export failed or did not verify."""


class ArtifactError(TransformerKitError):
    """An export folder that cannot be loaded: missing, foreign, of another version, or damaged."""


class ProviderError(TransformerKitError):
    """An onnxruntime execution provider that was asked for cannot run on this machine."""


class DependencyError(TransformerKitError, ImportError):
    """What was asked for needs a package this install lacks (building, importing or exporting a
    model needs torch: ``pip install 'transformer-kit[torch]'``)."""


def did_you_mean(given: str, allowed: Iterable[str]) -> str:
    """A ' Did you mean 'x'?' suffix when ``given`` is close to one of ``allowed``, else ''."""
    close = difflib.get_close_matches(given, list(allowed), n=1, cutoff=0.6)
    return f" Did you mean {close[0]!r}?" if close else ""


def missing_path(path: object, what: str) -> str:
    """'PATH does not exist; give WHAT.' for every loader, so a typo reads the same everywhere."""
    return f"{str(path)!r} does not exist; give {what}."
