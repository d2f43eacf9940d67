"""The tokenizer a GGUF file describes in its ``tokenizer.ggml.*`` metadata, rebuilt as the
``tokenizer.json`` + ``tokenizer_config.json`` a Hugging Face checkpoint ships, so it is an
ordinary :class:`TextTokenizer` (saved and exported with the model).

As transformers' GGUF tokenizer conversion (``integrations/gguf/gguf_tokenizer_mapping.py``)
builds it, without transformers: byte-level BPE (``tokenizer.ggml.model`` ``gpt2``) with the
file's merges and the pre-tokenizer split of ``tokenizer.ggml.pre``, or Llama's sentencepiece
(``llama``) as BPE with byte fallback and merges recovered from the scores; CONTROL tokens as
special added tokens and USER_DEFINED ones as plain added tokens, BOS prepended when
``tokenizer.ggml.add_bos_token`` says so, and the chat template of ``tokenizer.chat_template``.
"""

from __future__ import annotations

import json
import warnings
from functools import lru_cache
from typing import Any

from transformer_kit.checkpoints.gguf.file import field_value
from transformer_kit.tokenizer import TextTokenizer

#: llama.cpp's token types (``tokenizer.ggml.token_type``).
UNKNOWN, CONTROL, USER_DEFINED = 2, 3, 4
#: Architectures whose sentencepiece tokenizer differs from Llama's (Gemma respells spaces and
#: orders merges by position, Phi-3 prepends its space in a normalizer): not rebuilt yet.
SENTENCEPIECE_VARIANTS = frozenset({"gemma", "gemma2", "gemma3", "phi3"})

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
#: o200k's split (gpt-oss, GPT-4o): camel-case words apart, digits in threes.
_GPT4O_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
#: tokenizer.ggml.pre -> the regular expression text is split by before byte-level BPE (the
#: others, GPT-2's ``default`` and SmolLM's ``smollm`` among them, use GPT-2's own).
PRE_TOKENIZER_SPLITS = {
    "llama3": _LLAMA3_SPLIT, "llama-v3": _LLAMA3_SPLIT, "llama-bpe": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT, "dbrx": _LLAMA3_SPLIT, "falcon3": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT, "deepseek-r1-qwen": _QWEN2_SPLIT, "megrez": _QWEN2_SPLIT,
    "gpt-4o": _GPT4O_SPLIT,
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


def merges_from_scores(tokens: list[str], scores: list[float]) -> list[list[str]]:
    """A sentencepiece vocabulary's BPE merges (its file lists none): every split of a token into
    two tokens, best-scored merged token first (transformers' ``generate_merges``)."""
    vocab = {t: i for i, t in enumerate(tokens)}
    found = []
    for token, score in dict(zip(tokens, scores, strict=True)).items():
        pairs = [(token[:i], token[i:]) for i in range(1, len(token))
                 if token[:i] in vocab and token[i:] in vocab]
        found += [(a, b, score) for a, b in sorted(pairs, key=lambda p: (vocab[p[0]], vocab[p[1]]))]
    found.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [[a, b] for a, b, _ in found]


def _sentencepiece_json(tokens: list[str], types: list[int], scores: list[float],
                        special: tuple[str | None, int | None]) -> dict[str, Any]:
    """A Llama / Mistral sentencepiece vocabulary as BPE with byte fallback (``<0x41>``)."""
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": kind in (UNKNOWN, CONTROL)}
             for i, (t, kind) in enumerate(zip(tokens, types, strict=True))
             if kind in (UNKNOWN, CONTROL, USER_DEFINED)]
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first",
                          "split": False},
        "post_processor": _post_processor(*special),
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True,
                  "ignore_merges": False, "vocab": {t: i for i, t in enumerate(tokens)},
                  "merges": merges_from_scores(tokens, scores)},
    }


def gguf_tokenizer(reader: Any, where: str, arch: str) -> TextTokenizer | None:
    """The file's tokenizer, or None (with a warning naming what is missing) when it describes
    none or one of a kind the kit does not rebuild: it rebuilds ``gpt2`` (byte-level BPE) and
    ``llama`` (sentencepiece) but Gemma's and Phi-3's variants of it."""
    model = field_value(reader, "tokenizer.ggml.model")
    if model is None:
        return None
    if model not in ("gpt2", "llama") or (model == "llama" and arch in SENTENCEPIECE_VARIANTS):
        warnings.warn(f"{where}: the GGUF file's tokenizer is of kind {model!r} ({arch}); the kit "
                      "rebuilds 'gpt2' (byte-level BPE) and Llama's 'llama' (sentencepiece), so the "
                      "model has no tokenizer and takes token ids. Give model.tokenizer one from the "
                      "Hugging Face checkpoint (tk.TextTokenizer.from_folder).", UserWarning, stacklevel=3)
        return None
    tokens: list[str] = field_value(reader, "tokenizer.ggml.tokens")
    types = field_value(reader, "tokenizer.ggml.token_type") or [1] * len(tokens)
    config: dict[str, Any] = {}
    for name, key in _SPECIAL_NAMES.items():
        token_id = field_value(reader, f"tokenizer.ggml.{key}")
        config[name] = tokens[token_id] if isinstance(token_id, int) and token_id < len(tokens) else None
    # a sentencepiece file that does not say: llama.cpp adds BOS
    add_bos = bool(field_value(reader, "tokenizer.ggml.add_bos_token", model == "llama"))
    bos_id = field_value(reader, "tokenizer.ggml.bos_token_id")
    bos = (config["bos_token"], bos_id) if add_bos else (None, None)
    if model == "gpt2":
        data = _byte_level_json(tokens, types, field_value(reader, "tokenizer.ggml.merges") or [],
                                field_value(reader, "tokenizer.ggml.pre"), *bos)
    else:
        scores = field_value(reader, "tokenizer.ggml.scores") or [0.0] * len(tokens)
        data = _sentencepiece_json(tokens, types, scores, bos)
    config.update(add_bos_token=add_bos, add_eos_token=bool(
        field_value(reader, "tokenizer.ggml.add_eos_token", False)))
    template = field_value(reader, "tokenizer.chat_template")
    if template is not None:
        config["chat_template"] = template
    return TextTokenizer({
        "tokenizer.json": json.dumps(data, ensure_ascii=False).encode("utf-8"),
        "tokenizer_config.json": json.dumps(config, indent=2, ensure_ascii=False).encode("utf-8"),
    })
