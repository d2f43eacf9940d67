"""transformer-kit: Transformer components as pluggy plugins, assembled from a config.

    import transformer_kit as tk
    model = tk.build_model({"architecture": "decoder", "vocab_size": 1000, "positional": "rotary"})

This package is the core: interfaces, registry, hook specs, config, errors, attention, masks,
model assembly, generation, serialization and checkpoint reading. The built-in plugins
(``transformer_kit.plugins``), the ONNX export (``transformer_kit.export``) and the
applications (``transformer_kit.apps``: command line, demo, plots, benchmarks) sit on top of it;
nothing here imports them (the contracts in pyproject.toml check it).
"""

from transformer_kit.core.component import KINDS, MODEL_KINDS, CheckpointFamily, Component, Lowering
from transformer_kit.core.config import ComponentSpec, ModelConfig, load_config
from transformer_kit.core.decoding import GenerationConfig, LogitsProcessor
from transformer_kit.core.dependencies import needing_torch
from transformer_kit.core.errors import (
    ArtifactError,
    ChatTemplateError,
    CheckpointError,
    ComponentError,
    ConfigError,
    ContextLengthError,
    DependencyError,
    ExportError,
    InputError,
    MaskError,
    PluginError,
    ProviderError,
    TransformerKitError,
    UnknownComponentError,
)
from transformer_kit.core.graph_writer import GraphWriter
from transformer_kit.core.hookspecs import hookimpl, hookspec
from transformer_kit.core.registry import (
    Registry,
    get_registry,
    register_plugin,
    reset_registry,
    unregister_plugin,
)

__version__ = "0.1.0"


def build_model(config, registry=None):
    """Assemble a model from a config; see :func:`transformer_kit.core.assembly.build_model`."""
    return needing_torch("transformer_kit.core.assembly", "build_model")(config, registry)


def load_model(path):
    """Load a model saved with ``model.save(path)``: see
    :func:`transformer_kit.checkpoints.saved.load_model`."""
    return needing_torch("transformer_kit.checkpoints.saved", "load_model")(path)


def from_hf(path, **overrides):
    """Load a local Hugging Face checkpoint folder; see :func:`transformer_kit.checkpoints.from_hf`."""
    return needing_torch("transformer_kit.checkpoints", "from_hf")(path, **overrides)


def config_from_hf(path, **overrides):
    """The config of a Hugging Face checkpoint folder; see :mod:`transformer_kit.checkpoints`."""
    return needing_torch("transformer_kit.checkpoints", "config_from_hf")(path, **overrides)


def from_gguf(path, **overrides):
    """Load a GGUF file (llama.cpp); see :func:`transformer_kit.checkpoints.gguf.from_gguf`."""
    return needing_torch("transformer_kit.checkpoints.gguf", "from_gguf")(path, **overrides)


def config_from_gguf(path, **overrides):
    """The config of a GGUF file; see :func:`transformer_kit.checkpoints.gguf.config_from_gguf`."""
    return needing_torch("transformer_kit.checkpoints.gguf", "config_from_gguf")(path, **overrides)


__all__ = [
    "KINDS", "MODEL_KINDS", "ArtifactError", "ChatTemplateError", "CheckpointError",
    "CheckpointFamily", "Component",
    "ComponentError", "ComponentSpec", "ConfigError", "ContextLengthError", "DependencyError", "ExportError",
    "GenerationConfig", "GraphWriter",
    "InputError", "LogitsProcessor", "Lowering", "MaskError", "ModelConfig", "PluginError", "ProviderError",
    "Registry", "TransformerKitError", "UnknownComponentError", "__version__", "build_model",
    "config_from_gguf", "config_from_hf", "from_gguf", "from_hf", "get_registry", "hookimpl",
    "hookspec", "load_config", "load_model", "register_plugin", "reset_registry", "unregister_plugin",
]
