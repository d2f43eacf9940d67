"""Random dense GGUF files of a Qwen2.5 shape (llama.cpp's ``qwen2``), written tensor by tensor.

For the serving benchmark against llama.cpp's server on a file larger than SmolLM2's: the
Qwen2.5-0.5B shape (hidden 896, 24 layers, 14 heads over 2 key/value heads of 64, feed-forward
4864, vocabulary 151,936, tied embedding), with the tensors llama.cpp's converter writes for it
(q, k and v biases F32) and the types ``llama-quantize`` gives a Q4_0 file: the matrices Q4_0,
the tied embedding (also the head) Q8_0 (Q6_K where rows are a multiple of 256; 896 is not),
norms and biases F32. Values, vocabulary and the writing are :mod:`testbed.moe_gguf`'s.

    python -m testbed.dense_gguf /work/bench/serve/qwen2.5-0.5b-q4_0.gguf
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import gguf

from testbed.moe_gguf import FILE_TYPES, Q, TensorSpec, add_tokenizer, head_type, open_file, write_tensors


@dataclass(frozen=True)
class DenseShape:
    """A Qwen2 model's shape (config.json's names); the embedding is tied."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int
    rope_theta: float = 1e6
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 32768

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def parameters(self) -> int:
        d, kv = self.hidden_size, self.num_key_value_heads * self.head_dim
        layer = 2 * d * d + 2 * d * kv + 3 * d * self.intermediate_size + d + 2 * kv + 2 * d
        return self.num_hidden_layers * layer + self.vocab_size * d + d


SHAPES: dict[str, DenseShape] = {
    # Qwen/Qwen2.5-0.5B-Instruct's config.json
    "qwen2.5-0.5b": DenseShape(hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                               num_key_value_heads=2, intermediate_size=4864, vocab_size=151936),
    # the tests' shape
    "qwen2-tiny": DenseShape(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, intermediate_size=128, vocab_size=512),
}


def tensor_specs(shape: DenseShape, qtype: gguf.GGMLQuantizationType | str) -> list[TensorSpec]:
    """The file's tensors in llama.cpp's converter's order (``MODEL_TENSORS[QWEN2]``, tied:
    no ``output.weight``, so ``token_embd`` takes the head's type)."""
    qtype = Q[qtype] if isinstance(qtype, str) else qtype
    d, kv = shape.hidden_size, shape.num_key_value_heads * shape.head_dim
    specs = [TensorSpec("token_embd.weight", (shape.vocab_size, d), head_type(qtype, d))]
    for n in range(shape.num_hidden_layers):
        b = f"blk.{n}"
        specs += [
            TensorSpec(f"{b}.attn_norm.weight", (d,), Q.F32, "norm"),
            TensorSpec(f"{b}.attn_q.weight", (d, d), qtype),
            TensorSpec(f"{b}.attn_q.bias", (d,), Q.F32),
            TensorSpec(f"{b}.attn_k.weight", (kv, d), qtype),
            TensorSpec(f"{b}.attn_k.bias", (kv,), Q.F32),
            TensorSpec(f"{b}.attn_v.weight", (kv, d), qtype),
            TensorSpec(f"{b}.attn_v.bias", (kv,), Q.F32),
            TensorSpec(f"{b}.attn_output.weight", (d, d), qtype),
            TensorSpec(f"{b}.ffn_norm.weight", (d,), Q.F32, "norm"),
            TensorSpec(f"{b}.ffn_gate.weight", (shape.intermediate_size, d), qtype),
            TensorSpec(f"{b}.ffn_up.weight", (shape.intermediate_size, d), qtype),
            TensorSpec(f"{b}.ffn_down.weight", (d, shape.intermediate_size), qtype),
        ]
    return [*specs, TensorSpec("output_norm.weight", (d,), Q.F32, "norm")]


def write_dense_gguf(path: Path, shape: DenseShape | str, qtype: gguf.GGMLQuantizationType | str = "Q4_0",
                     seed: int = 0, progress: bool = False) -> Path:
    """A random ``qwen2`` GGUF file of ``shape`` (a :class:`DenseShape` or a name in
    :data:`SHAPES`) with its matrices in ``qtype`` (Q4_0, Q8_0 or F32), written to ``path`` one
    tensor at a time; the same shape, type and seed give the same bytes."""
    shape = SHAPES[shape] if isinstance(shape, str) else shape
    writer, qtype = open_file(path, gguf.MODEL_ARCH.QWEN2, shape, qtype)
    add_tokenizer(writer, shape.vocab_size)
    write_tensors(writer, tensor_specs(shape, qtype), seed, progress)
    return Path(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path)
    parser.add_argument("--shape", default="qwen2.5-0.5b", choices=sorted(SHAPES))
    parser.add_argument("--type", default="Q4_0", choices=[t.name for t in FILE_TYPES])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    shape = SHAPES[args.shape]
    print(f"{args.shape}: {shape.parameters() / 1e9:.2f}B parameters -> {args.path} ({args.type})")
    write_dense_gguf(args.path, shape, args.type, args.seed, progress=True)
    print(f"{args.path.stat().st_size / 1e9:.2f} GB written")


if __name__ == "__main__":
    main()
