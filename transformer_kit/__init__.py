"""transformer-kit: Transformer components as pluggy plugins, assembled from a config.

    import transformer_kit as tk
    model = tk.build_model({"architecture": "decoder", "vocab_size": 1000, "positional": "rotary"})
"""

from transformer_kit.component import KINDS, Component
from transformer_kit.config import ComponentSpec, ModelConfig, load_config
from transformer_kit.errors import (
    ComponentError,
    ConfigError,
    ExportError,
    InputError,
    MaskError,
    PluginError,
    TransformerKitError,
    UnknownComponentError,
)
from transformer_kit.hookspecs import hookimpl, hookspec
from transformer_kit.registry import (
    Registry,
    get_registry,
    register_plugin,
    reset_registry,
    unregister_plugin,
)

__version__ = "0.1.0"


def build_model(config, registry=None):
    """Assemble a model from a config; see :func:`transformer_kit.assembly.build_model`."""
    from transformer_kit.assembly import build_model as _build

    return _build(config, registry)


def from_hf(path, **overrides):
    """Load a local Hugging Face checkpoint folder; see :func:`transformer_kit.checkpoints.from_hf`."""
    from transformer_kit.checkpoints import from_hf as _from_hf

    return _from_hf(path, **overrides)


def load_model(path):
    """Load a model saved with ``model.save(path)``."""
    from transformer_kit.serialization import load_model as _load

    return _load(path)


__all__ = [
    "KINDS",
    "Component",
    "ComponentError",
    "ComponentSpec",
    "ConfigError",
    "ExportError",
    "InputError",
    "MaskError",
    "ModelConfig",
    "PluginError",
    "Registry",
    "TransformerKitError",
    "UnknownComponentError",
    "__version__",
    "build_model",
    "from_hf",
    "get_registry",
    "hookimpl",
    "hookspec",
    "load_config",
    "load_model",
    "register_plugin",
    "reset_registry",
    "unregister_plugin",
]
