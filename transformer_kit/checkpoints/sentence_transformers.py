"""sentence-transformers folders (``modules.json``): the Transformer module's checkpoint goes
through its family as any ``from_hf`` folder; ``Pooling``, ``Dense`` and ``Normalize`` become
the config's ``pooling`` and ``sentence_embedding`` (and the dense weights), and
``config_sentence_transformers.json`` gives the prompts, the similarity and a cross-encoder's
score activation. Both the current layout (sentence-transformers 5-6) and the older one
(``pooling_mode_*_token`` flags, ``sentence_transformers.models.*`` types) are read."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import Tensor

from transformer_kit.checkpoints.reader import read_hf_weights
from transformer_kit.core.errors import CheckpointError

#: sentence-transformers' pooling modes -> the registry's pooling components.
POOLING_NAMES = {"cls": "cls", "mean": "mean", "max": "max", "mean_sqrt_len_tokens": "mean_sqrt_len",
                 "weightedmean": "weightedmean", "lasttoken": "lasttoken"}
_LEGACY_FLAGS = {"pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max",
                 "pooling_mode_mean_tokens": "mean",
                 "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
                 "pooling_mode_weightedmean_tokens": "weightedmean",
                 "pooling_mode_lasttoken": "lasttoken"}
_ACTIVATIONS = {"Identity": "identity", "Tanh": "tanh", "Sigmoid": "sigmoid", "ReLU": "relu",
                "GELU": "gelu", "SiLU": "silu", "Softmax": "softmax"}
#: A tokenizer's model_max_length above this means "no limit" (transformers' 1e30 sentinel).
_NO_LIMIT = 10**9


@dataclass
class SentencePipeline:
    """What a sentence-transformers folder adds to its Transformer module's checkpoint."""

    folder: Path
    body: Path
    config: dict[str, Any] = field(default_factory=dict)
    classifier: dict[str, Any] = field(default_factory=dict)
    state: dict[str, Tensor] = field(default_factory=dict)

    def apply(self, data: dict[str, Any]) -> dict[str, Any]:
        """The family's kit config ``data`` with the pipeline's keys."""
        data = {**data, **self.config}
        if self.classifier and data.get("classifier") is not None:
            data["classifier"] = {**data["classifier"], **self.classifier}
        return data


def _read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{what} {str(path)!r} is missing; copy the sentence-transformers "
                              "folder again.") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{what} {str(path)!r} is not valid JSON ({exc}); copy the "
                              "sentence-transformers folder again.") from None


def _module_kind(entry: dict) -> str:
    """``sentence_transformers.models.Pooling`` (or ``...modules.pooling.Pooling``) -> Pooling."""
    return str(entry.get("type", "")).rsplit(".", 1)[-1]


def activation_name(path: str, where: str) -> str:
    """A torch.nn activation's import path -> the config's activation name; refused for others."""
    short = str(path).rsplit(".", 1)[-1]
    if short not in _ACTIVATIONS:
        raise CheckpointError(f"{where}: activation {path!r} is not supported; supported: "
                              f"{', '.join('torch.nn.' + n for n in _ACTIVATIONS)}.")
    return _ACTIVATIONS[short]


def _pooling(folder: Path, where: str) -> tuple[str, bool]:
    config = _read_json(folder / "config.json", "The Pooling config")
    mode = config.get("pooling_mode")
    if mode is None:
        modes = [m for flag, m in _LEGACY_FLAGS.items() if config.get(flag)]
        mode = modes if len(modes) != 1 else modes[0]
    if isinstance(mode, list) and len(mode) == 1:
        mode = mode[0]
    if not isinstance(mode, str) or mode not in POOLING_NAMES:
        raise CheckpointError(f"{where}: pooling mode {mode!r} is not supported; one of "
                              f"{', '.join(POOLING_NAMES)} is (concatenated modes are not).")
    return POOLING_NAMES[mode], bool(config.get("include_prompt", True))


def _dense(folder: Path, index: int, where: str) -> tuple[dict, dict[str, Tensor]]:
    config = _read_json(folder / "config.json", "The Dense config")
    if config.get("use_residual"):
        raise CheckpointError(f"{where}: a Dense layer with use_residual is not supported.")
    tensors = read_hf_weights(folder)
    prefix = f"sentence_head.dense.{index}.linear"
    state = {f"{prefix}.weight": tensors["linear.weight"]}
    if config.get("bias", True):
        state[f"{prefix}.bias"] = tensors["linear.bias"]
    layer = {"in_features": int(config["in_features"]), "out_features": int(config["out_features"]),
             "bias": bool(config.get("bias", True)),
             "activation": activation_name(config.get("activation_function", "torch.nn.Tanh"), where)}
    return layer, state


def _max_seq_length(body: Path) -> int | None:
    """sentence_bert_config.json's max_seq_length, else the tokenizer's model_max_length."""
    for name, key in (("sentence_bert_config.json", "max_seq_length"),
                      ("tokenizer_config.json", "model_max_length")):
        path = body / name
        if path.is_file():
            value = _read_json(path, f"The file {name}").get(key)
            if isinstance(value, (int, float)) and 0 < value < _NO_LIMIT:
                return int(value)
    return None


def _read_modules(folder: Path, modules: list, pipeline: SentencePipeline) -> tuple[str | None, dict]:
    """The pooling component (None without a Pooling module) and the ``sentence_embedding`` keys
    of the modules after the Transformer (Pooling, Dense, Normalize); the dense layers' weights
    go to ``pipeline.state``. Refuses other modules, naming them."""
    sentence: dict[str, Any] = {"dense": []}
    pooling = None
    for entry in modules[1:]:
        kind, where = _module_kind(entry), f"{str(folder)!r} module {entry.get('path')!r}"
        path = folder / entry.get("path", "")
        if kind == "Pooling":
            pooling, sentence["include_prompt"] = _pooling(path, where)
        elif kind == "Dense":
            layer, state = _dense(path, len(sentence["dense"]), where)
            sentence["dense"].append(layer)
            pipeline.state.update(state)
        elif kind == "Normalize":
            sentence["normalize"] = True
        else:
            raise CheckpointError(f"{where}: module {entry.get('type')!r} is not supported; the kit "
                                  "builds Transformer, Pooling, Dense and Normalize.")
    return pooling, sentence


def _add_settings(sentence: dict[str, Any], settings: dict[str, Any]) -> None:
    """The prompts, the default prompt's name and the similarity of
    ``config_sentence_transformers.json`` (``settings``) into ``sentence``."""
    sentence["prompts"] = {k: v for k, v in (settings.get("prompts") or {}).items() if v}
    if settings.get("default_prompt_name") in sentence["prompts"]:
        sentence["default_prompt_name"] = settings["default_prompt_name"]
    similarity = {"cos_sim": "cosine", "dot_score": "dot"}.get(
        settings.get("similarity_fn_name"), settings.get("similarity_fn_name"))
    if similarity in ("cosine", "dot", "euclidean", "manhattan"):
        sentence["similarity"] = similarity


def read_sentence_pipeline(folder: str | Path) -> SentencePipeline | None:
    """The pipeline of a sentence-transformers folder, or None when ``folder`` has no
    ``modules.json``. Refuses modules the kit does not build, naming them."""
    folder = Path(folder)
    if not (folder / "modules.json").is_file():
        return None
    modules = _read_json(folder / "modules.json", "The module list")
    if not isinstance(modules, list) or not modules or _module_kind(modules[0]) != "Transformer":
        raise CheckpointError(f"{str(folder)!r}: modules.json does not start with a Transformer "
                              "module; the kit loads sentence-transformers models built on one.")
    body = folder / modules[0].get("path", "")
    pipeline = SentencePipeline(folder, body)
    pooling, sentence = _read_modules(folder, modules, pipeline)
    extra = folder / "config_sentence_transformers.json"
    settings = _read_json(extra, "The settings") if extra.is_file() else {}
    if pooling is not None:
        pipeline.config["pooling"] = pooling
        _add_settings(sentence, settings)
        pipeline.config["sentence_embedding"] = sentence
    if settings.get("activation_fn"):
        pipeline.classifier["activation"] = activation_name(settings["activation_fn"], str(extra))
    bert_settings = body / "sentence_bert_config.json"
    if bert_settings.is_file() and _read_json(bert_settings, "The settings").get("do_lower_case"):
        pipeline.config["lowercase"] = True
    if (limit := _max_seq_length(body)) is not None:
        pipeline.config["max_seq_length"] = limit
    return pipeline
