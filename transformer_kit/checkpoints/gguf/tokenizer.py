"""The tokenizer a GGUF file describes in its ``tokenizer.ggml.*`` metadata, rebuilt as the
``tokenizer.json`` + ``tokenizer_config.json`` a Hugging Face checkpoint ships, so it is an
ordinary :class:`TextTokenizer` (saved and exported with the model).

As transformers' GGUF tokenizer conversion (``integrations/gguf/gguf_tokenizer_mapping.py``)
builds it, without transformers: byte-level BPE (``tokenizer.ggml.model`` ``gpt2``) with the
file's merges, the pre-tokenizer split of ``tokenizer.ggml.pre``, CONTROL tokens as special
added tokens and USER_DEFINED ones as plain added tokens, BOS prepended when
``tokenizer.ggml.add_bos_token`` says so, and the chat template of ``tokenizer.chat_template``.
"""

from __future__ import annotations

import json
import warnings
from functools import lru_cache
from typing import Any

from transformer_kit.checkpoints.gguf.file import field_value
from transformer_kit.decoding.text import TextTokenizer

#: llama.cpp's token types (``tokenizer.ggml.token_type``).
CONTROL, USER_DEFINED = 3, 4

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
#: tokenizer.ggml.pre -> the regular expression text is split by before byte-level BPE (the
#: others, GPT-2's ``default`` and SmolLM's ``smollm`` among them, use GPT-2's own).
PRE_TOKENIZER_SPLITS = {
    "llama3": _LLAMA3_SPLIT, "llama-v3": _LLAMA3_SPLIT, "llama-bpe": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT, "dbrx": _LLAMA3_SPLIT, "falcon3": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT, "deepseek-r1-qwen": _QWEN2_SPLIT, "megrez": _QWEN2_SPLIT,
}
_SPECIAL_NAMES = {"bos_token": "bos_token_id", "eos_token": "eos_token_id",
                  "unk_token": "unknown_token_id", "pad_token": "padding_token_id"}


@lru_cache(maxsize=1)
def byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character map (byte-level BPE spells every byte as one)."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    chars, extra = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in chars:
            chars[b], extra = chr(256 + extra), extra + 1
    return chars


def _pre_tokenizer(pre: str | None) -> dict[str, Any]:
    split = PRE_TOKENIZER_SPLITS.get(pre or "")
    if split is None:
        return {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    return {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": split}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}


def _post_processor(bos: str | None, bos_id: int | None) -> dict[str, Any]:
    single: list[dict] = [{"Sequence": {"id": "A", "type_id": 0}}]
    pair: list[dict] = [*single, {"Sequence": {"id": "B", "type_id": 1}}]
    special: dict[str, Any] = {}
    if bos is not None:
        first = {"SpecialToken": {"id": bos, "type_id": 0}}
        single, pair = [first, *single], [first, single[0], first, pair[1]]
        special[bos] = {"id": bos, "ids": [bos_id], "tokens": [bos]}
    return {"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": special}


def _byte_level_json(tokens: list[str], types: list[int], merges: list[str], pre: str | None,
                     bos: str | None, bos_id: int | None) -> dict[str, Any]:
    alphabet = set(byte_alphabet().values())
    spelling = byte_alphabet()
    vocab = {(t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8"))): i
             for i, t in enumerate(tokens)}
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": kind == CONTROL}
             for i, (t, kind) in enumerate(zip(tokens, types, strict=True))
             if (kind == CONTROL and set(t) <= alphabet) or kind == USER_DEFINED]
    byte_level = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": None, "pre_tokenizer": _pre_tokenizer(pre),
        "post_processor": _post_processor(bos, bos_id), "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": False, "vocab": vocab,
                  "merges": [m.split(" ", 1) for m in merges]},
    }


def gguf_tokenizer(reader: Any, where: str) -> TextTokenizer | None:
    """The file's tokenizer, or None (with a warning naming what is missing) when it describes
    none or one of a kind the kit does not rebuild (only ``gpt2``, byte-level BPE, is)."""
    model = field_value(reader, "tokenizer.ggml.model")
    if model is None:
        return None
    if model != "gpt2":
        warnings.warn(f"{where}: the GGUF file's tokenizer is of kind {model!r}; the kit rebuilds "
                      "only 'gpt2' (byte-level BPE) tokenizers, so the model has no tokenizer and "
                      "takes token ids. Give model.tokenizer one from the Hugging Face checkpoint "
                      "(tk.TextTokenizer.from_folder).", UserWarning, stacklevel=3)
        return None
    tokens: list[str] = field_value(reader, "tokenizer.ggml.tokens")
    types = field_value(reader, "tokenizer.ggml.token_type") or [1] * len(tokens)
    merges = field_value(reader, "tokenizer.ggml.merges") or []
    config: dict[str, Any] = {}
    for name, key in _SPECIAL_NAMES.items():
        token_id = field_value(reader, f"tokenizer.ggml.{key}")
        config[name] = tokens[token_id] if isinstance(token_id, int) and token_id < len(tokens) else None
    add_bos = bool(field_value(reader, "tokenizer.ggml.add_bos_token", False))
    bos_id = field_value(reader, "tokenizer.ggml.bos_token_id")
    data = _byte_level_json(tokens, types, merges, field_value(reader, "tokenizer.ggml.pre"),
                            config["bos_token"] if add_bos else None, bos_id)
    config.update(add_bos_token=add_bos, add_eos_token=bool(
        field_value(reader, "tokenizer.ggml.add_eos_token", False)))
    template = field_value(reader, "tokenizer.chat_template")
    if template is not None:
        config["chat_template"] = template
    return TextTokenizer({
        "tokenizer.json": json.dumps(data, ensure_ascii=False).encode("utf-8"),
        "tokenizer_config.json": json.dumps(config, indent=2, ensure_ascii=False).encode("utf-8"),
    })
