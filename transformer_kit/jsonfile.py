"""Reading a JSON file that must hold an object, with one typed error for every way it fails."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from transformer_kit.errors import TransformerKitError


def read_json_object(path: Path, error: type[TransformerKitError], hint: str) -> dict[str, Any]:
    """The JSON object in ``path``; a missing, undecodable or non-object file raises ``error``
    with ``hint`` (what to do) appended."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise error(f"Cannot read {str(path)!r}: {exc.strerror or exc}. {hint}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise error(f"{str(path)!r} is not valid JSON ({exc}). {hint}") from None
    if not isinstance(data, dict):
        raise error(f"{str(path)!r} does not hold a JSON object. {hint}")
    return data
