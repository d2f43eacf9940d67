"""Random GGUF files of a Qwen3-MoE shape (llama.cpp's ``qwen3moe``), written tensor by tensor.

For the mixture-of-experts benchmarks against llama.cpp: a Qwen3-30B-A3B shape is about 17 GB in
Q4_0, so no float model is ever made. Every tensor's info goes into the header first; then each
tensor is made (random, from its own seed) and written alone (gguf's ``write_tensor_data``), so
at most one tensor is in memory (the largest: the 30B shape's Q6_K head, 255 MB).

What a tensor holds, as llama.cpp's own files of that type have it (``convert_hf_to_gguf.py``
then ``llama-quantize``, whose ``llama_tensor_get_type`` decides each tensor's type):

- the matrices (attention, stacked experts ``blk.N.ffn_{gate,up,down}_exps``, the token
  embedding) in the file's type, written as random valid blocks: a random fp16 scale of either
  sign and random quants, so that the values are about N(0, 0.02) (Q4_0: ``d * (q - 8)``,
  q uniform in 0..15; Q8_0: ``d * q``, q uniform in -127..127; F32: normal values);
- the head ``output.weight``: Q6_K in a Q4_0 file (llama-quantize's choice for the output of
  every non-K type but Q8_0; Q8_0 when the rows are not a multiple of 256), the file's type
  otherwise;
- ``attn_k`` and ``attn_v`` Q8_0 in a quantized file of 8 experts (llama-quantize's rule for
  Mixtral's count; the tests' tiny shape has 8);
- the router ``ffn_gate_inp`` and every norm (``attn_norm``, ``ffn_norm``, ``attn_q_norm``,
  ``attn_k_norm``, ``output_norm``) F32: the converter writes routers F32 and llama-quantize
  never quantizes them or 1-D tensors. Norm weights are 1 + N(0, 0.02), router rows N(0, 0.02).

The vocabulary is a byte-level BPE (``tokenizer.ggml.model = gpt2``, pre-tokenizer ``qwen2``)
made up to any size: the 256 byte symbols, then strings of printable ASCII by length, each with
the merge of its prefix and last character, then Qwen's special tokens (``<|endoftext|>``,
``<|im_start|>``, ``<|im_end|>``, padded with ``<|extra_N|>`` to 151,936 as Qwen's 293 are).

    python -m testbed.moe_gguf --shape qwen3-30b-a3b --type Q4_0 /work/bench/moe/qwen3-30b-a3b-q4_0.gguf
"""

from __future__ import annotations

import argparse
import itertools
import time
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

Q = gguf.GGMLQuantizationType


@dataclass(frozen=True)
class MoeShape:
    """A Qwen3-MoE model's shape (config.json's names)."""

    hidden_size: int
    num_hidden_layers: int
    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    intermediate_size: int  # the dense width in the config (no dense layer uses it)
    rope_theta: float = 1e6
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 40960

    def _attention(self) -> int:
        """q, k, v and o of one layer."""
        return self.hidden_size * self.head_dim * 2 * (self.num_attention_heads + self.num_key_value_heads)

    def parameters(self) -> int:
        attention = self._attention()
        experts = 3 * self.num_experts * self.moe_intermediate_size * self.hidden_size
        layer = attention + experts + self.num_experts * self.hidden_size
        return self.num_hidden_layers * layer + 2 * self.vocab_size * self.hidden_size

    def active_parameters(self) -> int:
        """Parameters a token reads: attention, router, its top-k experts, the head."""
        attention = self._attention()
        experts = 3 * self.num_experts_per_tok * self.moe_intermediate_size * self.hidden_size
        return (self.num_hidden_layers * (attention + experts + self.num_experts * self.hidden_size)
                + self.vocab_size * self.hidden_size)


SHAPES: dict[str, MoeShape] = {
    # Qwen/Qwen3-30B-A3B's config.json
    "qwen3-30b-a3b": MoeShape(hidden_size=2048, num_hidden_layers=48, num_experts=128,
                              num_experts_per_tok=8, moe_intermediate_size=768,
                              num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                              vocab_size=151936, intermediate_size=6144),
    # the benchmarks' small shape: Qwen3-0.6B's attention (hidden 1024, 16 heads, 8 KV heads of
    # 128) over 16 layers of 64 experts, 8 per token, each 256 wide (the 30B's width ratio,
    # 768 / 2048, rounded down), a 32k vocabulary: 0.97B parameters (3.9 GB in F32, 0.55 GB in
    # Q4_0), 0.24B read per token
    "qwen3-moe-small": MoeShape(hidden_size=1024, num_hidden_layers=16, num_experts=64,
                                num_experts_per_tok=8, moe_intermediate_size=256,
                                num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                                vocab_size=32768, intermediate_size=3072),
    # the tests' shape
    "qwen3-moe-tiny": MoeShape(hidden_size=64, num_hidden_layers=2, num_experts=8,
                               num_experts_per_tok=2, moe_intermediate_size=32,
                               num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                               vocab_size=512, intermediate_size=128),
}

FILE_TYPES = {Q.F32: gguf.LlamaFileType.ALL_F32, Q.Q4_0: gguf.LlamaFileType.MOSTLY_Q4_0,
              Q.Q8_0: gguf.LlamaFileType.MOSTLY_Q8_0}
QWEN_REGULAR_TOKENS = 151643  # Qwen's ids below <|endoftext|>
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                 "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
WEIGHT_STD = 0.02


# -- the vocabulary ----------------------------------------------------------------------------
def byte_symbols() -> list[str]:
    """GPT-2's byte -> printable character table (``bytes_to_unicode``), in byte order."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    symbols, extra = {}, 0
    for byte in range(256):
        if byte in kept:
            symbols[byte] = chr(byte)
        else:
            symbols[byte] = chr(256 + extra)
            extra += 1
    return [symbols[b] for b in range(256)]


def vocabulary(size: int) -> tuple[list[str], list[int], list[str], dict[str, int]]:
    """(tokens, token types, merges, special ids) of a byte-level BPE vocabulary of ``size``
    tokens: the byte symbols, printable ASCII strings by length (each the merge of its prefix
    and last character), then the special tokens (Qwen's three, padded up to 151,936 for
    Qwen's size)."""
    regular = min(size - len(SPECIALS), QWEN_REGULAR_TOKENS)
    if regular < 256:
        raise ValueError(f"a vocabulary of {size} tokens cannot hold the 256 byte symbols and "
                         f"{len(SPECIALS)} special tokens")
    tokens = byte_symbols()
    merges: list[str] = []
    printable = [chr(c) for c in range(ord("!"), ord("~") + 1)]
    for length in itertools.count(2):
        if len(tokens) >= regular:
            break
        for letters in itertools.product(printable, repeat=length):
            if len(tokens) >= regular:
                break
            token = "".join(letters)
            tokens.append(token)
            merges.append(f"{token[:-1]} {token[-1]}")
    specials = SPECIALS + [f"<|extra_{i}|>" for i in range(size - regular - len(SPECIALS))]
    types = [1] * regular + [3] * len(specials)  # NORMAL, CONTROL
    ids = {name: regular + i for i, name in enumerate(SPECIALS)}
    return tokens + specials, types, merges, ids


# -- the tensors -------------------------------------------------------------------------------
@dataclass(frozen=True)
class TensorSpec:
    """One tensor of the file: its name, PyTorch-order shape (rows last), stored type and what
    its values are ("weight": about N(0, 0.02); "norm": 1 + N(0, 0.02))."""

    name: str
    shape: tuple[int, ...]
    qtype: gguf.GGMLQuantizationType
    kind: str = "weight"

    def nbytes(self) -> int:
        block, size = gguf.GGML_QUANT_SIZES[self.qtype]
        count = int(np.prod(self.shape))
        return count // block * size

    def byte_shape(self) -> tuple[int, ...]:
        block, size = gguf.GGML_QUANT_SIZES[self.qtype]
        return (*self.shape[:-1], self.shape[-1] // block * size)


def head_type(qtype: gguf.GGMLQuantizationType, hidden: int) -> gguf.GGMLQuantizationType:
    """``output.weight``'s type in a file of ``qtype`` (llama-quantize: Q6_K for a quantized
    file's head unless the file is Q8_0; Q8_0 when a row is not a multiple of 256)."""
    if qtype in (Q.F32, Q.F16, Q.Q8_0):
        return qtype
    return Q.Q6_K if hidden % 256 == 0 else Q.Q8_0


def tensor_specs(shape: MoeShape, qtype: gguf.GGMLQuantizationType | str) -> list[TensorSpec]:
    """The file's tensors in llama.cpp's converter's order (names from gguf's
    ``TENSOR_NAMES``, the set of ``MODEL_TENSORS[QWEN3MOE]``)."""
    qtype = Q[qtype] if isinstance(qtype, str) else qtype
    d, hd = shape.hidden_size, shape.head_dim
    # llama-quantize gives an 8-expert model (Mixtral's count) Q8_0 keys and values
    kv = Q.Q8_0 if shape.num_experts == 8 and qtype not in (Q.F32, Q.F16) else qtype
    e, ff = shape.num_experts, shape.moe_intermediate_size
    specs = [TensorSpec("token_embd.weight", (shape.vocab_size, d), qtype)]
    for n in range(shape.num_hidden_layers):
        b = f"blk.{n}"
        specs += [
            TensorSpec(f"{b}.attn_norm.weight", (d,), Q.F32, "norm"),
            TensorSpec(f"{b}.attn_q.weight", (shape.num_attention_heads * hd, d), qtype),
            TensorSpec(f"{b}.attn_k.weight", (shape.num_key_value_heads * hd, d), kv),
            TensorSpec(f"{b}.attn_v.weight", (shape.num_key_value_heads * hd, d), kv),
            TensorSpec(f"{b}.attn_output.weight", (d, shape.num_attention_heads * hd), qtype),
            TensorSpec(f"{b}.attn_q_norm.weight", (hd,), Q.F32, "norm"),
            TensorSpec(f"{b}.attn_k_norm.weight", (hd,), Q.F32, "norm"),
            TensorSpec(f"{b}.ffn_norm.weight", (d,), Q.F32, "norm"),
            TensorSpec(f"{b}.ffn_gate_inp.weight", (e, d), Q.F32),
            TensorSpec(f"{b}.ffn_gate_exps.weight", (e, ff, d), qtype),
            TensorSpec(f"{b}.ffn_up_exps.weight", (e, ff, d), qtype),
            TensorSpec(f"{b}.ffn_down_exps.weight", (e, d, ff), qtype),
        ]
    specs += [TensorSpec("output_norm.weight", (d,), Q.F32, "norm"),
              TensorSpec("output.weight", (shape.vocab_size, d), head_type(qtype, d))]
    return specs


def _signed_scales(rng: np.random.Generator, count: int, magnitude: float) -> np.ndarray:
    """``count`` fp16 scales of either sign, |scale| uniform in 0.75..1.25 x ``magnitude``."""
    scales = rng.uniform(0.75, 1.25, count) * magnitude
    return (scales * rng.choice(np.array([-1.0, 1.0]), count)).astype(np.float16)


def random_tensor(spec: TensorSpec, rng: np.random.Generator) -> np.ndarray:
    """``spec``'s values: float32 in its shape, or its blocks as bytes (..., bytes per row)."""
    if spec.qtype == Q.F32:
        values = rng.standard_normal(spec.shape, dtype=np.float32) * np.float32(WEIGHT_STD)
        return values + np.float32(1) if spec.kind == "norm" else values
    block, size = gguf.GGML_QUANT_SIZES[spec.qtype]
    blocks = int(np.prod(spec.shape)) // block
    data = np.frombuffer(bytearray(rng.bytes(blocks * size)), np.uint8).reshape(blocks, size)
    if spec.qtype == Q.Q4_0:  # d (fp16), 16 bytes of two 4-bit quants: value d * (q - 8)
        scale = WEIGHT_STD / np.sqrt(21.25)  # (q - 8)'s standard deviation: sqrt((16**2 - 1) / 12)
        data[:, :2] = _signed_scales(rng, blocks, scale).view(np.uint8).reshape(blocks, 2)
    elif spec.qtype == Q.Q8_0:  # d (fp16), 32 int8 quants: value d * q (-128 kept out)
        quants = data[:, 2:].view(np.int8)
        quants[quants == -128] = -127
        scale = WEIGHT_STD / 73.3  # q's standard deviation
        data[:, :2] = _signed_scales(rng, blocks, scale).view(np.uint8).reshape(blocks, 2)
    elif spec.qtype == Q.Q6_K:  # ql[128] qh[64] scales int8[16] d (fp16): d * scale * (q - 32)
        scales = rng.integers(24, 64, (blocks, 16)) * rng.choice(np.array([-1, 1]), (blocks, 16))
        data[:, 192:208] = scales.astype(np.int8).view(np.uint8)
        scale = WEIGHT_STD / (18.5 * 44)  # (q - 32)'s standard deviation x a typical |scale|
        data[:, 208:210] = _signed_scales(rng, blocks, scale).view(np.uint8).reshape(blocks, 2)
    else:
        raise ValueError(f"no random blocks for {spec.qtype.name}")
    return data.reshape(spec.byte_shape())


# -- the file ----------------------------------------------------------------------------------
def add_tokenizer(writer: gguf.GGUFWriter, vocab_size: int) -> None:
    """The vocabulary of :func:`vocabulary`, Qwen's special ids and the chat template."""
    tokens, types, merges, ids = vocabulary(vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_eos_token_id(ids["<|im_end|>"])
    writer.add_pad_token_id(ids["<|endoftext|>"])
    writer.add_bos_token_id(ids["<|endoftext|>"])
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)


def write_tensors(writer: gguf.GGUFWriter, specs: list[TensorSpec], seed: int, progress: bool) -> None:
    """The header, then each of ``specs`` made (random, from its own seed) and written alone."""
    for spec in specs:
        if spec.qtype == Q.F32:
            writer.add_tensor_info(spec.name, spec.shape, np.dtype(np.float32), spec.nbytes())
        else:
            writer.add_tensor_info(spec.name, spec.byte_shape(), np.dtype(np.uint8), spec.nbytes(),
                                   raw_dtype=spec.qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    total = sum(s.nbytes() for s in specs)
    written, start = 0, time.perf_counter()
    for index, spec in enumerate(specs):
        writer.write_tensor_data(random_tensor(spec, np.random.default_rng([seed, index])))
        written += spec.nbytes()
        if progress and (index % 24 == 0 or index == len(specs) - 1):
            print(f"  {written / 1e9:6.2f} / {total / 1e9:.2f} GB  ({spec.name}, "
                  f"{time.perf_counter() - start:.0f} s)", flush=True)
    writer.close()


def open_file(path: Path, arch: gguf.MODEL_ARCH, shape, qtype: gguf.GGMLQuantizationType | str
              ) -> tuple[gguf.GGUFWriter, gguf.GGMLQuantizationType]:
    """A writer of ``path`` (folders made) for ``arch`` with the keys every shape has (config.json's
    names on ``shape``) written, and ``qtype`` checked (Q4_0, Q8_0 or F32)."""
    qtype = Q[qtype] if isinstance(qtype, str) else qtype
    if qtype not in FILE_TYPES:
        raise ValueError(f"file type {qtype.name}: Q4_0, Q8_0 or F32")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    name = gguf.MODEL_ARCH_NAMES[arch]
    writer = gguf.GGUFWriter(path, name)
    writer.add_name(f"random {qtype.name} {name}")
    writer.add_file_type(FILE_TYPES[qtype])
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_context_length(shape.max_position_embeddings)
    writer.add_embedding_length(shape.hidden_size)
    writer.add_block_count(shape.num_hidden_layers)
    writer.add_feed_forward_length(shape.intermediate_size)
    writer.add_head_count(shape.num_attention_heads)
    writer.add_head_count_kv(shape.num_key_value_heads)
    writer.add_rope_freq_base(shape.rope_theta)
    writer.add_layer_norm_rms_eps(shape.rms_norm_eps)
    return writer, qtype


def _metadata(writer: gguf.GGUFWriter, shape: MoeShape) -> None:
    """What a Qwen3-MoE file adds to :func:`open_file`'s keys."""
    writer.add_key_length(shape.head_dim)
    writer.add_value_length(shape.head_dim)
    writer.add_expert_count(shape.num_experts)
    writer.add_expert_used_count(shape.num_experts_per_tok)
    writer.add_expert_feed_forward_length(shape.moe_intermediate_size)
    add_tokenizer(writer, shape.vocab_size)


def write_moe_gguf(path: Path, shape: MoeShape | str, qtype: gguf.GGMLQuantizationType | str = "Q4_0",
                   seed: int = 0, progress: bool = False) -> Path:
    """A random ``qwen3moe`` GGUF file of ``shape`` (a :class:`MoeShape` or a name in
    :data:`SHAPES`) with its matrices in ``qtype`` (Q4_0, Q8_0 or F32), written to ``path`` one
    tensor at a time; the same shape, type and seed give the same bytes."""
    shape = SHAPES[shape] if isinstance(shape, str) else shape
    writer, qtype = open_file(path, gguf.MODEL_ARCH.QWEN3MOE, shape, qtype)
    _metadata(writer, shape)
    write_tensors(writer, tensor_specs(shape, qtype), seed, progress)
    return Path(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path)
    parser.add_argument("--shape", default="qwen3-moe-small", choices=sorted(SHAPES))
    parser.add_argument("--type", default="Q4_0", choices=[t.name for t in FILE_TYPES])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    shape = SHAPES[args.shape]
    print(f"{args.shape}: {shape.parameters() / 1e9:.2f}B parameters, "
          f"{shape.active_parameters() / 1e9:.2f}B read per token -> {args.path} ({args.type})")
    write_moe_gguf(args.path, shape, args.type, args.seed, progress=True)
    print(f"{args.path.stat().st_size / 1e9:.2f} GB written")


if __name__ == "__main__":
    main()
