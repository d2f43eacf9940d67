"""LoRA adapters at run time: the files ``adapters/NAME.safetensors`` an export wrote beside
its base (:mod:`transformer_kit.export.adapters` says how the graphs take them), listed and read
as the graph inputs a call binds, as onnxruntime-genai's Adapters API binds them.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from transformer_kit.core.errors import ArtifactError, InputError

ADAPTER_FOLDER = "adapters"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def check_adapter_names(names: list[str]) -> None:
    """Refuse names that are not file and model names (letters, digits, '.', '_', '-')."""
    for name in names:
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise InputError(f"Adapter name {name!r} is not allowed; use letters, digits, '.', '_' "
                             "and '-' (up to 64, starting with a letter or digit).")


def adapter_names(folder: Path) -> list[str]:
    """The adapters exported in ``folder`` (sorted)."""
    return sorted(p.stem for p in (Path(folder) / ADAPTER_FOLDER).glob("*.safetensors"))


def read_adapter_values(folder: Path, name: str) -> dict[str, np.ndarray]:
    """Adapter ``name``'s input values in export ``folder``; an unknown name is refused naming
    the exported ones."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    names = adapter_names(folder)
    if name not in names:
        raise InputError(f"adapter={name!r} is not exported in {str(folder)!r}; it has "
                         f"{', '.join(map(repr, names)) or 'none'}. Export with "
                         "tk.from_hf(..., adapters={name: DIR}) to add one.")
    try:
        return load_file(str(Path(folder) / ADAPTER_FOLDER / f"{name}.safetensors"))
    except (SafetensorError, OSError) as exc:
        raise ArtifactError(f"Cannot read adapter {name!r} of {str(folder)!r}: {exc}. Export the "
                            "model again.") from None
