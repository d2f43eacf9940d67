"""Config files: a ``.yaml``, ``.yml`` or ``.json`` file read into a dict, every problem (a
missing file, a wrong suffix, a syntax error at a line and column) a :class:`ConfigError`
sentence saying how to fix it. :mod:`transformer_kit.core.config` validates what it holds.

The JSON files a folder describes itself with (a saved model's or a checkpoint's
``config.json``, ``generation_config.json``, an export's manifest) are read by
:func:`read_json_object`, each problem raised as the caller's error."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from transformer_kit.core.errors import ConfigError, TransformerKitError, missing_path


def _syntax_error(path: Path, exc: Exception) -> str:
    """One line: the file, the line and column, what is wrong there, and how to fix it."""
    if isinstance(exc, json.JSONDecodeError):
        return (f"Config file {str(path)!r} is not valid JSON at line {exc.lineno}, column "
                f"{exc.colno}: {exc.msg}. Fix the JSON there (strings in double quotes, no "
                "trailing commas), or write the config as YAML.")
    mark = getattr(exc, "problem_mark", None)
    problem = " ".join(str(getattr(exc, "problem", None) or exc).split())
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    if "'\\t'" in problem or "\t" in problem:
        return (f"Config file {str(path)!r} is not valid YAML{where}: a tab character. YAML "
                "indents with spaces only; replace the tab with spaces.")
    return (f"Config file {str(path)!r} is not valid YAML{where}: {problem}. Fix the YAML there "
            "(indent with spaces, 'key: value' pairs, quote values holding ': ' or '#').")


def read_config_file(path: str | Path) -> dict[str, Any]:
    """Read a .yaml/.yml/.json file into a dict; raises :class:`ConfigError` on any problem."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".yaml", ".yml", ".json"):
        raise ConfigError(f"Config file {str(path)!r} has suffix {suffix!r}; use .yaml, .yml or .json.")
    if not path.exists():
        raise ConfigError(missing_path(path, "a .yaml, .yml or .json config file"))
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or exc
        raise ConfigError(f"Cannot read config file {str(path)!r}: {reason}.") from None
    if not text.strip():
        raise ConfigError(f"Config file {str(path)!r} is empty; it must hold a mapping of keys.")
    try:
        data = json.loads(text) if suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(_syntax_error(path, exc)) from None
    if not isinstance(data, dict):
        raise ConfigError(
            f"Config file {str(path)!r} holds a {type(data).__name__}; it must hold a mapping of keys."
        )
    return data


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
