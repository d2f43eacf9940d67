"""Saving and loading models: ``config.json`` plus ``model.safetensors`` in one folder."""

from __future__ import annotations

import json
from pathlib import Path

from safetensors import SafetensorError
from safetensors.torch import load_model as load_weights
from safetensors.torch import save_model as save_weights

from transformer_kit.config import config_from_dict
from transformer_kit.errors import TransformerKitError
from transformer_kit.jsonfile import read_json_object

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


def save_model(model, path: str | Path) -> Path:
    """Write the model's config and weights into the folder ``path`` (created if needed)."""
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    config = {"format": "transformer_kit", "format_version": 1, "config": model.config.to_dict()}
    (folder / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    save_weights(model, str(folder / WEIGHTS_FILE))  # handles tied weights
    return folder


def load_model(path: str | Path):
    """Rebuild a model saved with ``model.save(path)``: same config, same weights."""
    from transformer_kit.assembly import build_model

    folder = Path(path)
    config_path, weights_path = folder / CONFIG_FILE, folder / WEIGHTS_FILE
    for needed in (config_path, weights_path):
        if not needed.is_file():
            raise TransformerKitError(
                f"{str(folder)!r} is not a saved transformer_kit model: {needed.name} is missing. "
                "Save one with model.save(path)."
            )
    saved = read_json_object(config_path, TransformerKitError, "Save the model again.")
    if saved.get("format") != "transformer_kit":
        raise TransformerKitError(f"{str(config_path)!r} was not written by model.save.")
    model = build_model(config_from_dict(saved.get("config")))
    try:
        missing, unexpected = load_weights(model, str(weights_path), strict=False)
    except (SafetensorError, RuntimeError, OSError) as exc:
        raise TransformerKitError(
            f"Cannot load weights from {str(weights_path)!r} into the model its config describes: "
            f"{str(exc).splitlines()[0]}"
        ) from None
    if missing or unexpected:
        raise TransformerKitError(
            f"Weights in {str(weights_path)!r} do not match the config: missing "
            f"{sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}."
        )
    return model
