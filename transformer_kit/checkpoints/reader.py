"""Reading a local Hugging Face checkpoint folder: ``config.json`` and its weights, safely.

Weights come from ``model.safetensors``, a sharded ``model.safetensors.index.json``, or
``pytorch_model.bin`` (``torch.load`` with ``weights_only=True``, never pickle's full power).
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import Tensor

from transformer_kit.core.config_files import read_json_object
from transformer_kit.core.errors import CheckpointError, missing_path


def read_hf_config(folder: str | Path) -> dict[str, Any]:
    """The checkpoint's ``config.json`` as a dict, with the keys only its
    ``generation_config.json`` holds (where transformers now saves ``forced_bos_token_id`` and
    the other generation defaults) filled in from there, and its nulls too."""
    path = Path(folder) / "config.json"
    if not Path(folder).exists():
        raise CheckpointError(missing_path(folder, "a Hugging Face checkpoint folder"))
    if not path.is_file():
        raise CheckpointError(f"{str(folder)!r} is not a Hugging Face checkpoint folder: config.json "
                              "is missing.")
    config = read_json_object(path, CheckpointError, "Give a Hugging Face checkpoint folder.")
    generation = Path(folder) / "generation_config.json"
    if generation.is_file():
        defaults = read_json_object(generation, CheckpointError, "Fix or remove generation_config.json.")
        # a null in config.json is unset there (transformers saves Whisper's suppress_tokens so)
        config = {**defaults, **{k: v for k, v in config.items() if v is not None or k not in defaults}}
    return config


def _shards(folder: Path, index_name: str) -> list[Path]:
    index = json.loads((folder / index_name).read_text(encoding="utf-8"))
    return [folder / name for name in sorted(set(index["weight_map"].values()))]


def read_hf_weights(folder: str | Path) -> dict[str, Tensor]:
    """Every tensor of the checkpoint, by its Hugging Face name, floats as float32."""
    folder = Path(folder)
    tensors: dict[str, Tensor] = {}
    try:
        if (folder / "model.safetensors").is_file():
            tensors = load_file(str(folder / "model.safetensors"))
        elif (folder / "model.safetensors.index.json").is_file():
            for shard in _shards(folder, "model.safetensors.index.json"):
                tensors.update(load_file(str(shard)))
        elif (folder / "pytorch_model.bin").is_file():
            tensors = torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
        elif (folder / "pytorch_model.bin.index.json").is_file():
            for shard in _shards(folder, "pytorch_model.bin.index.json"):
                tensors.update(torch.load(shard, map_location="cpu", weights_only=True))
        else:
            raise CheckpointError(
                f"{str(folder)!r} has no weights: expected model.safetensors, "
                "model.safetensors.index.json, pytorch_model.bin or pytorch_model.bin.index.json."
            )
    except CheckpointError:
        raise
    except (SafetensorError, OSError, RuntimeError, KeyError, ValueError, EOFError,
            json.JSONDecodeError, pickle.UnpicklingError) as exc:
        # torch.load(weights_only=True) refuses pickles holding anything but tensors with an
        # UnpicklingError; it is reported like any unreadable file, never loaded unsafely
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"Cannot read the weights in {str(folder)!r}: {message}") from None
    if not isinstance(tensors, dict):
        raise CheckpointError(f"The weights in {str(folder)!r} are not a mapping of names to tensors.")
    return {k: (v.float() if v.is_floating_point() else v) for k, v in tensors.items()}


class Weights:
    """The checkpoint's tensors, looked up by name with the model's optional prefix."""

    def __init__(self, tensors: dict[str, Tensor], folder: str | Path, prefixes: tuple[str, ...],
                 probe: str) -> None:
        self.tensors = tensors
        self.folder = str(folder)
        found = [p for p in prefixes if p + probe in tensors]
        if not found:
            raise CheckpointError(
                f"The weights in {self.folder!r} do not look like this model type: no tensor named "
                f"{' or '.join(repr(p + probe) for p in prefixes)}."
            )
        self.prefix = found[0]

    def has(self, name: str) -> bool:
        return self.prefix + name in self.tensors or name in self.tensors

    def get(self, *names: str) -> Tensor:
        """The first of ``names`` present (with the model's prefix, or as written)."""
        for name in names:
            for key in (self.prefix + name, name):
                if key in self.tensors:
                    return self.tensors[key]
        raise CheckpointError(f"The weights in {self.folder!r} lack {self.prefix + names[0]!r}.")
