"""The ids that end a checkpoint's generated text: a chat model's end of turn (``<|im_end|>``,
``<|eot_id|>``, ``<end_of_turn>``) is often not config.json's ``eos_token_id``."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from transformer_kit.tokenizer import TextTokenizer


def _ids(value: Any) -> list[int]:
    values = value if isinstance(value, list) else [value]
    return [v for v in values if isinstance(v, int) and not isinstance(v, bool) and v >= 0]


def end_ids(folder: str | Path, config_eos: Any, tokenizer: TextTokenizer | None,
            vocab: int) -> list[int]:
    """The union, in this order, of config.json's ``eos_token_id`` (an id or a list),
    generation_config.json's and the id of the tokenizer's ``eos_token``; ids outside the
    vocabulary are left out (they name no token)."""
    found = _ids(config_eos)
    generation = Path(folder) / "generation_config.json"
    if generation.is_file():
        # a broken file: read_hf_config has named it already
        with contextlib.suppress(json.JSONDecodeError, UnicodeDecodeError, AttributeError):
            found += _ids(json.loads(generation.read_text(encoding="utf-8")).get("eos_token_id"))
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        found.append(tokenizer.eos_token_id)
    return [i for i in dict.fromkeys(found) if i < vocab]
