"""The saved-model format: ``config.json`` (the config, tagged) plus ``model.safetensors`` in one
folder. :func:`save_model` writes it; :func:`transformer_kit.checkpoints.saved.load_model` builds the
model again from :func:`read_saved_config` and fills it with :func:`load_saved_weights`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from safetensors import SafetensorError

from transformer_kit.core.config import ModelConfig, config_from_dict
from transformer_kit.core.config_files import read_json_object
from transformer_kit.core.errors import CheckpointError, missing_path

if TYPE_CHECKING:  # reading the format needs no torch; saving and loading weights do
    from torch import nn

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
FORMAT = "transformer_kit"


def save_model(model: Any, path: str | Path) -> Path:
    """Write the model's config and weights (and its tokenizer files, when it has a
    tokenizer) into the folder ``path`` (created if needed)."""
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    config = {"format": FORMAT, "format_version": 1, "config": model.config.to_dict()}
    if getattr(model, "generation_defaults", None):  # the checkpoint's sampling defaults
        config["generation_defaults"] = dict(model.generation_defaults)
    (folder / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    from safetensors.torch import save_model as save_weights

    save_weights(model, str(folder / WEIGHTS_FILE))  # handles tied weights
    if getattr(model, "tokenizer", None) is not None:
        model.tokenizer.save(folder)
    return folder


def is_saved_model(folder: Path) -> bool:
    """Whether ``folder`` holds a config written by :func:`save_model` (weights not checked)."""
    path = folder / CONFIG_FILE
    if not path.is_file():
        return False
    try:
        return json.loads(path.read_text(encoding="utf-8")).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def read_saved_config(path: str | Path) -> ModelConfig:
    """The config of a folder saved with ``model.save``; raises :class:`CheckpointError`."""
    folder = Path(path)
    if not folder.exists():
        raise CheckpointError(missing_path(folder, "a folder saved with model.save(path)"))
    for needed in (folder / CONFIG_FILE, folder / WEIGHTS_FILE):
        if not needed.is_file():
            raise CheckpointError(
                f"{str(folder)!r} is not a saved transformer_kit model: {needed.name} is missing. "
                "Save one with model.save(path)."
            )
    saved = read_json_object(folder / CONFIG_FILE, CheckpointError, "Save the model again.")
    if saved.get("format") != FORMAT:
        raise CheckpointError(f"{str(folder / CONFIG_FILE)!r} was not written by model.save.")
    return config_from_dict(saved.get("config"))


def load_saved_weights(model: nn.Module, path: str | Path) -> nn.Module:
    """Fill ``model`` with the weights of a safetensors file (``model.safetensors`` of a saved
    folder, or any file); every tensor must match. Raises :class:`CheckpointError`."""
    weights_path = Path(path)
    if weights_path.is_dir():
        weights_path = weights_path / WEIGHTS_FILE
    if not weights_path.exists():
        raise CheckpointError(missing_path(weights_path, "a safetensors file of the model's weights"))
    try:
        from safetensors.torch import load_model as load_weights

        missing, unexpected = load_weights(model, str(weights_path), strict=False)
    except (SafetensorError, RuntimeError, OSError) as exc:
        raise CheckpointError(
            f"Cannot load weights from {str(weights_path)!r} into the model its config describes: "
            f"{str(exc).splitlines()[0]}"
        ) from None
    if missing or unexpected:
        raise CheckpointError(
            f"Weights in {str(weights_path)!r} do not match the config: missing "
            f"{sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}."
        )
    return model
