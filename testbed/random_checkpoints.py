"""Random Hugging Face checkpoints in the shapes of real models, written shard by shard.

For the export benchmarks and the memory tests: a Llama 3.1 8B shape is 16 GB in bfloat16, so
its tensors are made and written one shard at a time (never the whole model in memory, never
built by transformers). The values are random (normal, std 0.02; norms 1): the shapes, dtypes,
names and files are what the real checkpoints have.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

#: config.json of each shape (the published models' sizes; no rope scaling).
SHAPES: dict[str, dict[str, Any]] = {
    "llama-100m": {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 32000,
        "hidden_size": 768, "intermediate_size": 2048, "num_hidden_layers": 8,
        "num_attention_heads": 12, "num_key_value_heads": 4, "tie_word_embeddings": False,
        "rope_theta": 10000.0, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
    },
    "qwen2.5-0.5b": {
        "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "vocab_size": 151936,
        "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
        "num_attention_heads": 14, "num_key_value_heads": 2, "tie_word_embeddings": True,
        "rope_theta": 1000000.0, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
    },
    "llama-3.1-8b": {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 128256,
        "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "tie_word_embeddings": False,
        "rope_theta": 500000.0, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
    },
}


def tensor_shapes(config: dict[str, Any]) -> Iterator[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every tensor of a Llama-layout checkpoint (Qwen2 adds q/k/v biases)."""
    d, ff, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    head_dim = d // config["num_attention_heads"]
    kv = config["num_key_value_heads"] * head_dim
    yield "model.embed_tokens.weight", (vocab, d)
    for i in range(config["num_hidden_layers"]):
        layer = f"model.layers.{i}"
        for name, shape in (("q_proj", (d, d)), ("k_proj", (kv, d)), ("v_proj", (kv, d)), ("o_proj", (d, d))):
            yield f"{layer}.self_attn.{name}.weight", shape
            if config["model_type"] == "qwen2" and name != "o_proj":
                yield f"{layer}.self_attn.{name}.bias", (shape[0],)
        yield f"{layer}.mlp.gate_proj.weight", (ff, d)
        yield f"{layer}.mlp.up_proj.weight", (ff, d)
        yield f"{layer}.mlp.down_proj.weight", (d, ff)
        yield f"{layer}.input_layernorm.weight", (d,)
        yield f"{layer}.post_attention_layernorm.weight", (d,)
    yield "model.norm.weight", (d,)
    if not config["tie_word_embeddings"]:
        yield "lm_head.weight", (vocab, d)


def write_random_checkpoint(folder: str | Path, shape: str, *, dtype: torch.dtype = torch.bfloat16,
                            shard_bytes: int = 2_000_000_000, seed: int = 0) -> int:
    """Write config.json and random weights of ``shape`` (a key of :data:`SHAPES`) in
    ``dtype`` to ``folder``, in safetensors shards of at most ``shard_bytes`` (with an index
    when there are several); returns the weights' bytes."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = {**SHAPES[shape], "torch_dtype": str(dtype).removeprefix("torch.")}
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    generator = torch.Generator().manual_seed(seed)
    shards: list[dict[str, torch.Tensor]] = [{}]
    weight_map, total, size = {}, 0, 0

    def flush() -> None:
        number = len(shards)
        save_file(shards[-1], str(folder / f"model-{number:05d}.safetensors"), metadata={"format": "pt"})
        shards[-1] = {}  # free it; keep the count

    for name, tensor_shape in tensor_shapes(config):
        if "norm" in name:
            tensor = torch.ones(tensor_shape, dtype=dtype)
        else:
            tensor = (torch.randn(tensor_shape, generator=generator) * 0.02).to(dtype)
        nbytes = tensor.numel() * tensor.element_size()
        if size and size + nbytes > shard_bytes:
            flush()
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        weight_map[name] = len(shards)
        size += nbytes
        total += nbytes
    flush()
    count = len(shards)
    if count == 1:
        (folder / "model-00001.safetensors").rename(folder / "model.safetensors")
        return total
    for number in range(1, count + 1):
        (folder / f"model-{number:05d}.safetensors").rename(
            folder / f"model-{number:05d}-of-{count:05d}.safetensors")
    index = {"metadata": {"total_size": total}, "weight_map": {
        name: f"model-{number:05d}-of-{count:05d}.safetensors" for name, number in weight_map.items()}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return total
