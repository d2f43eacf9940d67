"""A random gpt-oss checkpoint in the Hub's layout (openai/gpt-oss-20b's), written shard by shard.

config.json is gpt-oss-20b's (as the Hub has it: ``rope_scaling`` and a top-level
``rope_theta``, the MXFP4 ``quantization_config``); the experts are MXFP4 as the Hub stores
them: ``model.layers.N.mlp.experts.gate_up_proj_blocks`` (E, 2 * intermediate, hidden / 32, 16)
uint8 (two FP4 E2M1 codes a byte) with ``_scales`` (E, 2 * intermediate, hidden / 32) uint8
(E8M0 exponents), ``down_proj_blocks`` / ``_scales`` alike over intermediate; everything else
(attention with its biases and sinks, the router, the embedding, the head) bfloat16, norms 1.
The scales lie in 2^-7..2^-5, so the experts' weights are about 0.01-0.05 (the largest code,
6, times 2^-5 is 0.19). A byte-level BPE tokenizer of exactly ``vocab_size`` tokens is made
here (no training: every 1- and 2-byte string, then 3-byte ones), its special tokens at the
Hub's ids (``<|startoftext|>`` 199998, ``<|endoftext|>`` 199999 = pad, ``<|return|>`` 200002 =
eos; the rest reserved). Each tensor is made and written in turn, at most one shard
(``shard_bytes``) in memory; the 20b shape is about 13.8 GB on disk.

    python testbed/random_gpt_oss.py /work/bench/gptoss/gpt-oss-20b-shape           # 20b shape
    python testbed/random_gpt_oss.py tiny --layers 2 --hidden 64 --experts 4 ...     # any shape
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

#: openai/gpt-oss-20b's config.json (the Hub's, written by transformers 4.55).
GPT_OSS_20B: dict[str, Any] = {
    "architectures": ["GptOssForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
    "eos_token_id": 200002, "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu",
    "hidden_size": 2880, "initial_context_length": 4096, "initializer_range": 0.02,
    "intermediate_size": 2880, "layer_types": ["sliding_attention", "full_attention"] * 12,
    "max_position_embeddings": 131072, "model_type": "gpt_oss", "num_attention_heads": 64,
    "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 8,
    "num_local_experts": 32, "output_router_logits": False, "pad_token_id": 199999,
    "quantization_config": {"modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"],
        "quant_method": "mxfp4"},
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                     "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": False},
    "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128, "swiglu_limit": 7.0,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.55.0.dev0",
    "use_cache": True, "vocab_size": 201088,
}
#: The Hub's special tokens after the text tokens (o200k_harmony): id offset from the first.
SPECIALS = {"<|startoftext|>": 0, "<|endoftext|>": 1, "<|return|>": 4, "<|constrain|>": 5,
            "<|channel|>": 7, "<|start|>": 8, "<|end|>": 9, "<|message|>": 10, "<|call|>": 14}
#: gpt-oss-20b's first special id (199998); a smaller vocabulary keeps 16 ids at its end.
FIRST_SPECIAL = 199998
#: The scales' E8M0 exponents (127 = 2^0): 2^-7..2^-5.
SCALES = (120, 122)


def gpt_oss_config(layers: int = 24, hidden: int = 2880, heads: int = 64, kv_heads: int = 8,
                   head_dim: int = 64, experts: int = 32, top_k: int = 4, intermediate: int = 2880,
                   vocab: int = 201088, sliding_window: int = 128) -> dict[str, Any]:
    """gpt-oss-20b's config.json with its sizes replaced (the defaults are 20b's own)."""
    if hidden % 32 or intermediate % 32:
        raise ValueError(f"hidden {hidden} and intermediate {intermediate} must be multiples of 32 "
                         "(MXFP4 blocks)")
    first = first_special(vocab)
    return {**GPT_OSS_20B, "num_hidden_layers": layers, "hidden_size": hidden, "num_attention_heads": heads,
            "num_key_value_heads": kv_heads, "head_dim": head_dim, "num_local_experts": experts,
            "experts_per_token": top_k, "num_experts_per_tok": top_k, "intermediate_size": intermediate,
            "vocab_size": vocab, "sliding_window": sliding_window,
            "layer_types": (["sliding_attention", "full_attention"] * layers)[:layers],
            "pad_token_id": first + SPECIALS["<|endoftext|>"], "eos_token_id": first + SPECIALS["<|return|>"]}


def first_special(vocab: int) -> int:
    """The first special token's id: 199998 at 20b's vocabulary, else 16 before the end."""
    first = FIRST_SPECIAL if vocab == GPT_OSS_20B["vocab_size"] else vocab - 16
    if first < 256:
        raise ValueError(f"vocab {vocab}: a byte-level tokenizer needs at least 272 tokens "
                         "(256 bytes, 16 specials)")
    return first


def tensor_shapes(config: dict[str, Any]) -> Iterator[tuple[str, tuple[int, ...], str]]:
    """(name, shape, kind) of every tensor of the Hub's gpt-oss layout; kind is ``bf16``,
    ``norm``, ``sinks``, ``blocks`` or ``scales``."""
    d, ff, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    e, hd = config["num_local_experts"], config["head_dim"]
    q, kv = config["num_attention_heads"] * hd, config["num_key_value_heads"] * hd
    yield "model.embed_tokens.weight", (vocab, d), "bf16"
    for i in range(config["num_hidden_layers"]):
        layer = f"model.layers.{i}"
        yield f"{layer}.input_layernorm.weight", (d,), "norm"
        for name, rows, cols in (("q_proj", q, d), ("k_proj", kv, d), ("v_proj", kv, d), ("o_proj", d, q)):
            yield f"{layer}.self_attn.{name}.weight", (rows, cols), "bf16"
            yield f"{layer}.self_attn.{name}.bias", (rows,), "bf16"
        yield f"{layer}.self_attn.sinks", (config["num_attention_heads"],), "sinks"
        yield f"{layer}.post_attention_layernorm.weight", (d,), "norm"
        yield f"{layer}.mlp.router.weight", (e, d), "bf16"
        yield f"{layer}.mlp.router.bias", (e,), "bf16"
        for name, rows, cols in (("gate_up_proj", 2 * ff, d), ("down_proj", d, ff)):
            yield f"{layer}.mlp.experts.{name}_blocks", (e, rows, cols // 32, 16), "blocks"
            yield f"{layer}.mlp.experts.{name}_scales", (e, rows, cols // 32), "scales"
            yield f"{layer}.mlp.experts.{name}_bias", (e, rows), "bf16"
    yield "model.norm.weight", (d,), "norm"
    yield "lm_head.weight", (vocab, d), "bf16"


def _random(shape: tuple[int, ...], kind: str, generator: torch.Generator) -> torch.Tensor:
    """One tensor's random values, made in chunks of rows (a 20b embedding is 1.2 GB in
    bfloat16; its float32 normals at once would be 2.3 GB more)."""
    if kind == "norm":
        return torch.ones(shape, dtype=torch.bfloat16)
    if kind == "blocks":  # every byte two uniform E2M1 codes
        return torch.randint(0, 256, shape, dtype=torch.uint8, generator=generator)
    if kind == "scales":
        return torch.randint(SCALES[0], SCALES[1] + 1, shape, dtype=torch.uint8, generator=generator)
    std = 0.5 if kind == "sinks" else 0.02
    out = torch.empty(shape, dtype=torch.bfloat16)
    flat = out.view(shape[0], -1)
    step = max(1, (1 << 24) // flat.shape[1])
    for start in range(0, shape[0], step):
        rows = flat[start:start + step]
        rows.copy_(torch.randn(rows.shape, generator=generator) * std)
    return out


def write_random_gpt_oss(folder: str | Path, config: dict[str, Any] | None = None, *,
                         shard_bytes: int = 2_000_000_000, seed: int = 0) -> int:
    """Write ``config`` (default gpt-oss-20b's) as config.json, generation_config.json, random
    weights in the Hub's layout in safetensors shards of at most ``shard_bytes`` (named as the
    Hub's, ``model-00000-of-0000N.safetensors``, with ``model.safetensors.index.json``) and a
    tokenizer of ``vocab_size`` tokens to ``folder``; returns the weights' bytes."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = dict(config or GPT_OSS_20B)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    first = first_special(config["vocab_size"])
    (folder / "generation_config.json").write_text(json.dumps({
        "bos_token_id": first, "do_sample": True, "eos_token_id": [first + 4, first + 1, first + 14],
        "pad_token_id": first + 1, "transformers_version": "4.55.0.dev0"}, indent=2))
    write_tokenizer(folder, config["vocab_size"])
    generator = torch.Generator().manual_seed(seed)
    shard: dict[str, torch.Tensor] = {}
    weight_map: dict[str, int] = {}
    total = size = count = 0

    def flush() -> None:
        nonlocal shard, size, count
        save_file(shard, str(folder / f"shard-{count:05d}.safetensors"), metadata={"format": "pt"})
        shard, size, count = {}, 0, count + 1

    for name, shape, kind in tensor_shapes(config):
        tensor = _random(shape, kind, generator)
        nbytes = tensor.numel() * tensor.element_size()
        if size and size + nbytes > shard_bytes:
            flush()
        shard[name], weight_map[name] = tensor, count
        size += nbytes
        total += nbytes
        del tensor
    flush()
    last = count - 1  # the Hub counts from 0: model-00000-of-00002 is the first of three
    for number in range(count):
        (folder / f"shard-{number:05d}.safetensors").rename(
            folder / f"model-{number:05d}-of-{last:05d}.safetensors")
    index = {"metadata": {"total_size": total}, "weight_map": {
        name: f"model-{number:05d}-of-{last:05d}.safetensors" for name, number in sorted(weight_map.items())}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return total


def write_tokenizer(folder: Path, vocab: int) -> None:
    """A byte-level BPE tokenizer of exactly ``vocab`` tokens (tokenizer.json,
    tokenizer_config.json): every byte, every pair of bytes, then 3-byte strings up to the first
    special id, each merged from its first two bytes and its last; the special tokens (named as
    gpt-oss's, the others ``<|reserved_N|>``) from there to the end."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())  # the 256 bytes as characters
    first = first_special(vocab)
    tokens, merges = list(alphabet), []
    for length in (2, 3):
        for index in range(len(alphabet) ** length):
            if len(tokens) == first:
                break
            chars = [alphabet[(index // len(alphabet) ** k) % len(alphabet)] for k in reversed(range(length))]
            tokens.append("".join(chars))
            merges.append(("".join(chars[:-1]), chars[-1]))
    names = {offset: name for name, offset in SPECIALS.items()}
    specials = [names.get(i - first, f"<|reserved_{i}|>") for i in range(first, vocab)]
    tokenizer = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens + specials)}, merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|startoftext|>",
        "eos_token": "<|return|>", "pad_token": "<|endoftext|>", "model_max_length": 131072}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    for name, value in zip(gpt_oss_config.__code__.co_varnames, gpt_oss_config.__defaults__, strict=False):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=value)
    parser.add_argument("--shard-bytes", type=int, default=2_000_000_000)
    args = vars(parser.parse_args())
    folder, shard_bytes = args.pop("folder"), args.pop("shard_bytes")
    total = write_random_gpt_oss(folder, gpt_oss_config(**args), shard_bytes=shard_bytes)
    print(f"{folder}: {total / 1e9:.2f} GB of weights")


if __name__ == "__main__":
    main()
