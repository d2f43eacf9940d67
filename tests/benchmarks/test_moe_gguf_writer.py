"""The random Qwen3-MoE GGUF files of the mixture-of-experts benchmarks (``testbed/moe_gguf.py``):
what gguf's reader finds in them is the shape asked for, the writer holds one tensor at a time,
llama.cpp reads them (its own quantizer chooses the same tensor types) and the kit's float32
export of the F32 file gives llama.cpp's greedy tokens (``benchmarks/moe_llama_cpp.py``)."""

from __future__ import annotations

import ctypes
import json
import math
import subprocess
import sys
import tracemalloc
from pathlib import Path

import gguf
import numpy as np
import pytest

from testbed.moe_gguf import SHAPES, MoeShape, tensor_specs, vocabulary, write_moe_gguf

ROOT = Path(__file__).parent.parent.parent
TINY = SHAPES["qwen3-moe-tiny"]
Q = gguf.GGMLQuantizationType


def _field(reader: gguf.GGUFReader, key: str):
    return reader.fields[key].contents()


@pytest.mark.parametrize("qtype", ["F32", "Q4_0", "Q8_0"])
def test_the_file_reads_back_as_the_shape_asked_for(tmp_path, qtype):
    path = write_moe_gguf(tmp_path / "tiny.gguf", TINY, qtype)
    reader = gguf.GGUFReader(path)
    assert _field(reader, "general.architecture") == "qwen3moe"
    for key, value in {"block_count": 2, "embedding_length": 64, "expert_count": 8, "expert_used_count": 2,
                       "expert_feed_forward_length": 32, "attention.head_count": 4,
                       "attention.head_count_kv": 2, "attention.key_length": 16,
                       "attention.value_length": 16}.items():
        assert _field(reader, f"qwen3moe.{key}") == value, key
    assert _field(reader, "qwen3moe.rope.freq_base") == pytest.approx(1e6)
    assert _field(reader, "qwen3moe.attention.layer_norm_rms_epsilon") == pytest.approx(1e-6)
    assert len(reader.fields["tokenizer.ggml.tokens"].data) == TINY.vocab_size
    assert _field(reader, "tokenizer.ggml.pre") == "qwen2"

    # every tensor llama.cpp's qwen3moe has (gguf's own names), in the dims and types asked for
    names = gguf.TENSOR_NAMES
    expected_names = {names[t].format(bid=n) + ".weight"
                      for t in gguf.MODEL_TENSORS[gguf.MODEL_ARCH.QWEN3MOE]
                      for n in range(TINY.num_hidden_layers)}
    tensors = {t.name: t for t in reader.tensors}
    assert set(tensors) == expected_names
    specs = {s.name: s for s in tensor_specs(TINY, qtype)}
    for name, tensor in tensors.items():
        assert tuple(int(d) for d in reversed(tensor.shape.tolist())) == specs[name].shape, name
        assert tensor.tensor_type == specs[name].qtype, name
    assert tensors["blk.1.ffn_gate_exps.weight"].shape.tolist() == [64, 32, 8]  # GGUF's {d, ff, experts}
    assert tensors["blk.1.ffn_down_exps.weight"].shape.tolist() == [32, 64, 8]
    assert tensors["blk.0.ffn_gate_inp.weight"].tensor_type == Q.F32
    assert tensors["blk.0.attn_q_norm.weight"].tensor_type == Q.F32

    experts = gguf.quants.dequantize(tensors["blk.0.ffn_up_exps.weight"].data,
                                     tensors["blk.0.ffn_up_exps.weight"].tensor_type)
    assert np.isfinite(experts).all() and 0.015 < experts.std() < 0.025
    norm = np.asarray(tensors["blk.0.attn_norm.weight"].data)
    assert abs(norm.mean() - 1) < 0.02


def test_the_same_seed_gives_the_same_bytes(tmp_path):
    a = write_moe_gguf(tmp_path / "a.gguf", TINY, "Q4_0", seed=3).read_bytes()
    assert a == write_moe_gguf(tmp_path / "b.gguf", TINY, "Q4_0", seed=3).read_bytes()
    assert a != write_moe_gguf(tmp_path / "c.gguf", TINY, "Q4_0", seed=4).read_bytes()


@pytest.mark.parametrize("qtype", ["F32", "Q4_0"])
def test_the_writer_holds_one_tensor_at_a_time(tmp_path, qtype):
    shape = MoeShape(hidden_size=256, num_hidden_layers=6, num_experts=16, num_experts_per_tok=4,
                     moe_intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                     head_dim=64, vocab_size=512, intermediate_size=512)
    largest = max(s.nbytes() for s in tensor_specs(shape, qtype))
    tracemalloc.start()
    try:
        path = write_moe_gguf(tmp_path / "m.gguf", shape, qtype)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert path.stat().st_size > 15 * largest  # many tensors of that size
    assert peak < 3 * largest + 2_000_000, (peak, largest)  # a tensor, its random source, the vocabulary


def test_the_vocabulary_is_a_consistent_byte_level_bpe():
    tokens, types, merges, ids = vocabulary(151936)
    assert len(tokens) == len(set(tokens)) == len(types) == 151936
    assert ids == {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645}  # Qwen's
    assert types[151642] == 1 and types[151643] == 3
    known = set(tokens)
    assert all(a in known and b in known and a + b in known for a, b in (m.split(" ") for m in merges[::997]))


def test_llama_cpp_reads_the_files_and_its_quantizer_chooses_the_same_types(tmp_path):
    llama_cpp = pytest.importorskip("llama_cpp")
    f32 = write_moe_gguf(tmp_path / "f32.gguf", TINY, "F32")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = int(gguf.LlamaFileType.MOSTLY_Q4_0)
    params.nthread = 1
    assert llama_cpp.llama_model_quantize(str(f32).encode(), str(tmp_path / "theirs.gguf").encode(),
                                          ctypes.byref(params)) == 0
    theirs = {t.name: t.tensor_type for t in gguf.GGUFReader(tmp_path / "theirs.gguf").tensors}
    assert theirs == {s.name: s.qtype for s in tensor_specs(TINY, "Q4_0")}

    llm = llama_cpp.Llama(model_path=str(write_moe_gguf(tmp_path / "q4.gguf", TINY, "Q4_0")),
                          n_threads=1, n_ctx=64, verbose=False)
    llm.eval(llm.tokenize(b"Hello there", add_bos=False))
    logits = np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(llm.n_vocab(),))
    assert np.isfinite(logits).all() and logits.std() > 0


def test_the_moe_benchmark_runs_and_the_float32_export_gives_llama_cpps_tokens(tmp_path):
    pytest.importorskip("llama_cpp")
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "moe_llama_cpp.py"), "--shape", "qwen3-moe-tiny",
         "--rounds", "1", "--new-tokens", "4", "--workdir", str(tmp_path),
         "--skip", "llama.cpp F32, OMP passive", "llama.cpp Q4_0, OMP passive",
         "kit int4 level 1"],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    runners = json.loads((tmp_path / "moe_llama_cpp.json").read_text())["runners"]
    assert set(runners) >= {"llama.cpp F32", "llama.cpp Q4_0", "kit float32", "kit int4"}
    # float32-exact: llama.cpp's greedy tokens
    assert runners["kit float32"]["greedy_shared_with_llama_cpp_same_file"] == 4
    # the prompt and the decoding timed apart, each against llama.cpp on the same file
    # (reported, not judged: the tiny shape's few decoding steps take less than the timings' noise)
    split = runners["kit int4"]["split_vs_llama_cpp"]
    assert all(math.isfinite(split[part]["same file"]) for part in ("prompt", "decode"))
    assert math.isfinite(runners["kit int4"]["prompt_tokens_per_s"])
    assert math.isfinite(runners["kit int4"]["decode_tokens_per_s"])
    assert "decode tokens/s" in result.stdout
