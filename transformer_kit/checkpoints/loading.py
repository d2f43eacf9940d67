"""``from_hf``: a local Hugging Face checkpoint folder as an assembled model, through the
checkpoint family a plugin registered for its ``model_type``."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any

from transformer_kit.assembly import build_model
from transformer_kit.checkpoints.reader import Weights, read_hf_config, read_hf_weights
from transformer_kit.component import CheckpointFamily
from transformer_kit.config import ModelConfig, config_from_dict
from transformer_kit.decoding.text import TextTokenizer
from transformer_kit.errors import CheckpointError
from transformer_kit.model import TransformerModel
from transformer_kit.registry import get_registry
from transformer_kit.registry_entries import RegisteredFamily

SPECIAL_IDS = ("pad_id", "bos_id", "eos_id")
_PACKAGE = str(Path(__file__).resolve().parents[1])


def _caller_level() -> int:
    """The stack level of the first frame outside transformer_kit, for warnings."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    return level


def _family(hf: dict, folder: str | Path) -> RegisteredFamily:
    try:
        return get_registry().family(hf.get("model_type"))
    except CheckpointError as exc:
        raise CheckpointError(f"Checkpoint {str(folder)!r}: {exc}") from None


def _drop_ids_outside_vocabulary(data: dict, model_type: str, overrides: dict[str, Any]) -> None:
    """Special ids that config.json sets beyond the vocabulary name no token, so no token can
    be them (transformers loads such checkpoints too): they become null, with one warning."""
    src = data.get("src_vocab_size") or data.get("vocab_size")
    tgt = data.get("tgt_vocab_size") or data.get("vocab_size")
    if not (isinstance(src, int) and isinstance(tgt, int)):
        return  # config validation names the missing vocabulary
    dropped = []
    for key in SPECIAL_IDS:
        value, vocab = data.get(key), min(src, tgt) if key == "pad_id" else tgt
        if key not in overrides and isinstance(value, int) and value >= vocab:
            data[key] = None
            dropped.append(f"{key} {value}")
    if dropped:
        warnings.warn(f"{model_type} config.json sets {' and '.join(dropped)}, outside the vocabulary "
                      f"(0..{min(src, tgt) - 1}); no token can be that, so it is null. Pass e.g. "
                      f"{dropped[0].split()[0]}=... (--{dropped[0].split()[0].replace('_', '-')} on the "
                      "command line) to choose one.", UserWarning, stacklevel=_caller_level())


def config_from_hf(folder: str | Path, **overrides: Any) -> ModelConfig:
    """The transformer_kit config equivalent to a checkpoint's ``config.json``.

    ``overrides`` replace keys of the result, e.g. ``pad_id=0`` for a GPT-2 without a pad
    token, ``eos_id=None``, or ``attention="matmul"``.
    """
    hf = read_hf_config(folder)
    return _config(hf, _family(hf, folder).family, folder, overrides)


def _config(hf: dict, family: CheckpointFamily, folder: str | Path,
            overrides: dict[str, Any]) -> ModelConfig:
    try:
        data = family.to_config(hf)
    except KeyError as exc:
        raise CheckpointError(f"{family.model_type} config.json in {str(folder)!r} lacks {exc}.") from None
    _drop_ids_outside_vocabulary(data, family.model_type, overrides)
    return config_from_dict({**data, **overrides})


def from_hf(folder: str | Path, **overrides: Any) -> TransformerModel:
    """Load a local Hugging Face checkpoint folder as an assembled transformer_kit model.

    The folder's ``model_type`` picks the checkpoint family a plugin registered (built in:
    gpt2, bert, llama, marian; ``tk.get_registry().model_types()`` lists them). The weights are
    read with safetensors (or ``torch.load(weights_only=True)``); the model's outputs equal the
    original's. ``overrides`` replace config keys (``pad_id=0``). The folder's tokenizer.json
    (and its config files) become ``model.tokenizer`` (text in, text out). The result is an
    ordinary model: ``model.save`` / ``tk.load_model`` and ``export_onnx`` work on it, and
    carry the tokenizer along.
    """
    hf = read_hf_config(folder)
    family = _family(hf, folder).family
    config = _config(hf, family, folder, overrides)
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
    model.tokenizer = TextTokenizer.from_folder(folder)
    return model.eval()
