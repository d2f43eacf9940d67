"""A folder written by ``model.save(path)`` (config.json, model.safetensors and the tokenizer's
files), built again: :func:`load_model`, which ``tk.load_model`` is."""

from __future__ import annotations

from pathlib import Path

from transformer_kit.core.assembly import build_model
from transformer_kit.core.config_files import read_json_object
from transformer_kit.core.decoding.defaults import read_defaults
from transformer_kit.core.errors import CheckpointError
from transformer_kit.core.model import TransformerModel
from transformer_kit.core.serialization import CONFIG_FILE, load_saved_weights, read_saved_config
from transformer_kit.tokenizer import TextTokenizer


def load_model(path: str | Path) -> TransformerModel:
    """Rebuild a model saved with ``model.save(path)``: same config, weights and tokenizer. Raises
    :class:`~transformer_kit.core.errors.CheckpointError` for a folder that is missing, damaged or
    holds something else."""
    model = build_model(read_saved_config(path))
    model.tokenizer = TextTokenizer.from_folder(path)
    saved = read_json_object(Path(path) / CONFIG_FILE, CheckpointError, "Save the model again.")
    model.generation_defaults = read_defaults(saved.get("generation_defaults") or {})
    return load_saved_weights(model, path)
