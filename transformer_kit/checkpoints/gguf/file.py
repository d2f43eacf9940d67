"""Opening a GGUF file (llama.cpp's format: metadata key/values, then tensors) with the ``gguf``
package's reader, every failure a :class:`CheckpointError` that names the file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from transformer_kit.core.errors import CheckpointError, missing_path

#: The 4 bytes every GGUF file starts with.
MAGIC = b"GGUF"
#: Metadata arrays longer than this are left out of :func:`read_metadata` (the vocabulary,
#: merges and token types: the tokenizer reads them itself).
_LONG_ARRAY = 4096


def open_gguf(path: str | Path) -> Any:
    """``gguf.GGUFReader`` over ``path`` (memory-mapped: nothing is read until a tensor is).

    Raises:
        CheckpointError: no such file, not a GGUF file, a truncated or malformed one, or the
            ``gguf`` package is not installed.
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointError(missing_path(path, "a GGUF file"))
    if not path.is_file():
        raise CheckpointError(f"{str(path)!r} is a folder, not a GGUF file; for a Hugging Face "
                              "checkpoint folder use tk.from_hf.")
    with path.open("rb") as file:
        magic = file.read(4)
    if magic != MAGIC:
        raise CheckpointError(f"{str(path)!r} is not a GGUF file: it starts with {magic!r}, a GGUF "
                              f"file with {MAGIC!r}. Give a .gguf file written by llama.cpp's tools.")
    try:
        from gguf import GGUFReader
    except ImportError:
        raise CheckpointError("Reading GGUF files needs the gguf package: pip install "
                              "'transformer-kit[gguf]' (or pip install gguf).") from None
    try:
        return GGUFReader(path, "r")
    except (ValueError, IndexError, KeyError, OSError, TypeError, OverflowError,
            UnicodeDecodeError) as exc:
        # numpy raises ValueError/IndexError reading past the end of a truncated file
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"Cannot read the GGUF file {str(path)!r} (truncated or damaged?): "
                              f"{message}. Copy or download it again.") from None


def field_value(reader: Any, key: str, default: Any = None) -> Any:
    """The metadata value ``key`` (an int, float, bool, str or list), or ``default``."""
    field = reader.fields.get(key)
    if field is None or not field.types:
        return default
    from gguf import GGUFValueType

    value = field.contents()
    if hasattr(value, "tolist"):
        value = value.tolist()
    if field.types[-1] == GGUFValueType.FLOAT32:  # the shortest decimal of the float32: 1e-06,
        value = _shortest(value)                  # as the source config said, not 9.99999997e-07
    return value


def _shortest(value: Any) -> Any:
    """float32 values (a number or a list) as the shortest decimals that read back to them."""
    if isinstance(value, list):
        return [_shortest(one) for one in value]
    return float(str(np.float32(value))) if isinstance(value, float) else value


def read_metadata(reader: Any) -> dict[str, Any]:
    """Every metadata key -> value, long arrays (the vocabulary) left out."""
    out: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or not field.types or len(field.data) > _LONG_ARRAY:
            continue
        out[key] = field_value(reader, key)
    return out
