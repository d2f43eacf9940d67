"""What the commands take from the command line: paths to models of every kind (or Hub names of
checkpoints and GGUF files), token ids, and the special-id overrides; each refused with a
sentence that names the flag or the path."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Any, NoReturn

import typer

from transformer_kit.core.errors import ArtifactError, CheckpointError, ConfigError, InputError, ProviderError
from transformer_kit.runtime.manifest import MANIFEST_FILE

ACCEPTED = ("a config file (.yaml, .yml, .json), a folder saved with model.save, a Hugging Face "
            "checkpoint folder, a GGUF file, an export folder, or a Hub name (org/name, "
            "org/name:FILE.gguf)")
#: The --revision option's help, the same on every command that takes a Hub name.
REVISION_HELP = "The branch, tag or commit of a SOURCE given as a Hub name (org/name); default: main."


class Provider(str, Enum):
    """Where onnxruntime runs: CUDA where a CUDA session works, else the CPU (auto)."""

    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


def kind_of(path: Path) -> str:
    """'missing', 'export', 'saved model', 'checkpoint', 'gguf', 'config file' or 'other'."""
    from transformer_kit.core.serialization import is_saved_model

    if not path.exists():
        return "missing"
    if path.is_dir():
        if (path / MANIFEST_FILE).is_file():
            return "export"
        if is_saved_model(path):
            return "saved model"
        checkpoint = (path / "config.json").is_file() or (path / "modules.json").is_file()
        return "checkpoint" if checkpoint else "other"
    if path.suffix.lower() == ".gguf":
        return "gguf"
    return "config file" if path.suffix.lower() in (".yaml", ".yml", ".json") else "other"


def _refuse(path: Path, kind: str, wanted: str, error: type[Exception], hint: str = "") -> NoReturn:
    described = {"missing": "does not exist", "export": "is an export folder (ONNX)",
                 "saved model": "is a saved PyTorch model folder",
                 "checkpoint": "is a Hugging Face checkpoint folder",
                 "gguf": "is a GGUF file (read without --from-hf)",
                 "config file": "is a config file",
                 "other": "is neither a config file nor a model folder"}[kind]
    raise error(f"{str(path)!r} {described}; give {wanted}.{' ' + hint if hint else ''}")


def parse_special_id(value: str | None, flag: str) -> int | str | None:
    """'none' -> None, '5' -> 5, not given -> '' (keep the model's own)."""
    if value is None:
        return ""
    if value.strip().lower() in ("none", "null"):
        return None
    try:
        number = int(value)
    except ValueError:
        raise typer.BadParameter(f"{value!r} is not a token id; give a number or 'none'.",
                                 param_hint=flag) from None
    if number < 0:
        raise typer.BadParameter(f"{number} is negative; give a token id >= 0 or 'none'.", param_hint=flag)
    return number


def special_id_overrides(pad_id: str | None, bos_id: str | None, eos_id: str | None) -> dict[str, Any]:
    """The config overrides the --pad-id/--bos-id/--eos-id flags ask for."""
    values = {"pad_id": parse_special_id(pad_id, "--pad-id"), "bos_id": parse_special_id(bos_id, "--bos-id"),
              "eos_id": parse_special_id(eos_id, "--eos-id")}
    return {key: value for key, value in values.items() if value != ""}


def split_adapters(values: list[str], flag: str = "--adapter") -> tuple[Path | None, dict[str, Path]]:
    """--adapter values: a plain DIR (merged; one at most) and NAME=DIR ones (kept apart)."""
    from transformer_kit.runtime.adapters import check_adapter_names

    merged, apart = [], {}
    for value in values:
        name, equals, folder = value.partition("=")
        if not equals:
            merged.append(Path(value))
            continue
        try:
            check_adapter_names([name])
        except InputError as exc:
            raise typer.BadParameter(str(exc), param_hint=flag) from None
        if name in apart:
            raise typer.BadParameter(f"adapter {name!r} is given twice; give each name once.",
                                     param_hint=flag)
        apart[name] = Path(folder)
    if len(merged) > 1:
        given = ", ".join(map(str, merged))
        raise typer.BadParameter(f"{len(merged)} adapters to merge were given ({given}); merge one, "
                                 "and name the others (NAME=DIR) to keep them apart.", param_hint=flag)
    return (merged[0] if merged else None), apart


def resolve_source(source: Path, revision: str | None = None, from_hf: bool = False,
                   weights: bool = True) -> tuple[Path, bool]:
    """SOURCE as a local path, a Hub name (org/name, org/name:FILE.gguf) as its cached snapshot
    folder or file (downloaded first where missing; a checkpoint's config and tokenizer only
    without ``weights``), and whether it is read as a Hugging Face checkpoint: with --from-hf,
    or a Hub name's checkpoint (which needs no flag)."""
    from transformer_kit.checkpoints.hub import is_hub_name, local_source

    hub = is_hub_name(source)
    local = local_source(source, revision=revision, weights=weights)
    return local, from_hf or (hub and kind_of(local) == "checkpoint")


def load_model(source: Path, *, from_hf: bool = False, weights: Path | None = None,
               overrides: dict[str, Any] | None = None, stream: bool = False,
               revision: str | None = None, adapter: Path | None = None):
    """A model from a config file (random weights unless ``weights``), a folder saved with
    model.save, a GGUF file (llama.cpp), or (``from_hf``) a Hugging Face checkpoint folder, in
    eval mode; a Hub name (at ``revision``) of a checkpoint or a GGUF file as well.
    ``stream``: a safetensors checkpoint's (or a GGUF file's) weights stay on disk until an
    export writes them. ``adapter``: a PEFT LoRA adapter folder merged into a Hugging Face
    checkpoint's weights (it implies ``from_hf``, as ``adapters`` in ``overrides`` does: adapters
    kept apart, by name)."""
    import transformer_kit as tk
    from transformer_kit.core.config import config_from_dict
    from transformer_kit.core.serialization import load_saved_weights, read_saved_config

    overrides = overrides or {}
    source, from_hf = resolve_source(source, revision, from_hf)
    kind = kind_of(source)
    adapted = adapter is not None or "adapters" in overrides
    if from_hf or adapted:
        if kind != "checkpoint":
            _refuse(source, kind, "a Hugging Face checkpoint folder with --from-hf" if not adapted
                    else "a Hugging Face checkpoint folder with --adapter (a LoRA adapter is merged "
                    "into a checkpoint's weights)", CheckpointError)
        safetensors = any((source / name).is_file() for name in
                          ("model.safetensors", "model.safetensors.index.json"))
        return tk.from_hf(source, stream=stream and safetensors, adapter=adapter, **overrides)
    if kind == "gguf":
        if weights is not None:
            raise CheckpointError(f"{str(source)!r} is a GGUF file, which holds its weights; leave "
                                  "out --weights.")
        return tk.from_gguf(source, stream=stream, **overrides)
    if kind == "checkpoint":
        _refuse(source, kind, "a config file or a folder saved with model.save", CheckpointError,
                "Add --from-hf to load a Hugging Face checkpoint.")
    if kind not in ("config file", "saved model"):
        _refuse(source, kind, "a config file, a folder saved with model.save or a GGUF file (or "
                "a Hugging Face checkpoint folder with --from-hf)", ConfigError)
    config = tk.load_config(source) if kind == "config file" else read_saved_config(source)
    if overrides:
        config = config_from_dict({**config.to_dict(), **overrides})
    model = tk.build_model(config)
    if kind == "saved model":
        load_saved_weights(model, source)
    if weights is not None:
        load_saved_weights(model, weights)
    return model.eval()


def resolve_config(source: Path, revision: str | None = None):
    """The config of any source: a config file, a saved model, a checkpoint or an export, or a
    Hub name (at ``revision``) of a checkpoint or a GGUF file."""
    import transformer_kit as tk
    from transformer_kit.core.serialization import read_saved_config
    from transformer_kit.runtime import Manifest

    source, _ = resolve_source(source, revision, weights=False)
    kind = kind_of(source)
    if kind == "export":
        return tk.load_config(Manifest.read(source).config)
    if kind == "saved model":
        return read_saved_config(source)
    if kind == "checkpoint":
        return tk.config_from_hf(source)
    if kind == "gguf":
        return tk.config_from_gguf(source)
    if kind == "config file":
        return tk.load_config(source)
    _refuse(source, kind, ACCEPTED, ConfigError)


def open_export(folder: Path, provider: Provider, batch_invariant: bool = True):
    """An OnnxModel of an export folder on ``--provider``; errors name the flag."""
    from transformer_kit.runtime import OnnxModel
    from transformer_kit.runtime.providers import cuda_works

    kind = kind_of(folder)
    if kind != "export":
        hint = (f"Export it first: transformer-kit export {folder} -o DIR"
                if kind in ("saved model", "config file") else "")
        _refuse(folder, kind, "an export folder (written by transformer-kit export)", ArtifactError, hint)
    if provider is Provider.cuda and not cuda_works():
        raise ProviderError("--provider cuda was asked for, but no CUDA session can be created here "
                            "(onnxruntime-gpu needs a GPU with CUDA 13 and cuDNN 9). Use --provider "
                            "auto to fall back to the CPU.")
    return OnnxModel(folder, providers=provider.value, batch_invariant=batch_invariant)


def parse_ids(text: str, flag: str = "--ids") -> list[list[int]]:
    """'5 6 7; 8 9' -> [[5, 6, 7], [8, 9]]: rows separated by ';', ids by spaces or commas."""
    try:
        rows = [[int(t) for t in row.replace(",", " ").split()] for row in text.split(";")]
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not token ids; write e.g. \"5 6 7; 8 9\".",
                                 param_hint=flag) from None
    if not rows or any(not r for r in rows):
        raise typer.BadParameter(f"{text!r} has an empty row; write e.g. \"5 6 7; 8 9\".",
                                 param_hint=flag)
    return rows


def pad_rows(rows: list[list[int]], pad_id: int | None):
    """Rows of different lengths right-padded with ``pad_id``: (batch, len) int64 numpy."""
    import numpy as np

    width = max(map(len, rows))
    if pad_id is None and any(len(r) != width for r in rows):
        raise typer.BadParameter("rows of different lengths need a pad_id in the model config.",
                                 param_hint="--ids")
    return np.array([r + [pad_id or 0] * (width - len(r)) for r in rows], dtype=np.int64)
