"""Hugging Face checkpoints as assembled transformer_kit models (no transformers needed).

    model = tk.from_hf("path/to/gpt2-folder")          # config.json + model.safetensors
    cfg = config_from_hf("path/to/folder")             # the ordinary transformer_kit config
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformer_kit.checkpoints.families import FAMILIES
from transformer_kit.checkpoints.reader import (
    CheckpointError,
    Weights,
    read_hf_config,
    read_hf_weights,
)
from transformer_kit.config import ModelConfig, config_from_dict

__all__ = ["SUPPORTED_MODEL_TYPES", "CheckpointError", "config_from_hf", "from_hf"]

SUPPORTED_MODEL_TYPES = tuple(sorted(FAMILIES))


def _family(hf: dict, folder: str | Path):
    model_type = hf.get("model_type")
    if model_type not in FAMILIES:
        raise CheckpointError(
            f"Checkpoint {str(folder)!r} has model_type {model_type!r}, which from_hf does not "
            f"support. Supported model types: {', '.join(SUPPORTED_MODEL_TYPES)}."
        )
    return FAMILIES[model_type]


def config_from_hf(folder: str | Path, **overrides: Any) -> ModelConfig:
    """The transformer_kit config equivalent to a checkpoint's ``config.json``.

    ``overrides`` replace keys of the result, e.g. ``pad_id=0`` for a GPT-2 without a pad
    token, or ``attention="matmul"``.
    """
    return _config(read_hf_config(folder), folder, overrides)


def _config(hf: dict, folder: str | Path, overrides: dict[str, Any]) -> ModelConfig:
    family = _family(hf, folder)
    try:
        data = family.to_config(hf)
    except KeyError as exc:
        raise CheckpointError(f"{family.model_type} config.json in {str(folder)!r} lacks {exc}.") from None
    return config_from_dict({**data, **overrides})


def from_hf(folder: str | Path, **overrides: Any):
    """Load a local Hugging Face checkpoint folder as an assembled transformer_kit model.

    Supported ``model_type``s: gpt2 (GPT2LMHeadModel), bert (BertModel: the last hidden state),
    llama (LlamaForCausalLM), marian (MarianMTModel). The weights are read with safetensors (or
    ``torch.load(weights_only=True)``); the model's outputs equal the original's. The result is
    an ordinary model: ``model.save`` / ``tk.load_model`` and ``export_onnx`` work on it.
    """
    from transformer_kit.assembly import build_model

    hf = read_hf_config(folder)
    config = _config(hf, folder, overrides)
    family = _family(hf, folder)
    weights = Weights(read_hf_weights(folder), folder, family.prefixes, family.probe)
    state = family.to_state_dict(hf, weights, config)
    model = build_model(config)
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    if missing:
        raise CheckpointError(f"Converting {str(folder)!r} left {missing[:5]} unset.")
    for name, tensor in state.items():
        if name not in expected or expected[name].shape != tensor.shape:
            shape = tuple(expected[name].shape) if name in expected else "no such parameter"
            raise CheckpointError(
                f"Checkpoint tensor for {name!r} has shape {tuple(tensor.shape)}, the model built "
                f"from its config.json expects {shape}. config.json and the weights disagree."
            )
    model.load_state_dict(state, strict=True)
    return model.eval()
