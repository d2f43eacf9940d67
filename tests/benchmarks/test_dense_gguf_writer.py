"""The random Qwen2 GGUF files of the serving benchmark (``testbed/dense_gguf.py``): gguf's reader
finds the shape asked for, llama.cpp's quantizer chooses the same tensor types from the F32 file,
and the kit reads the F32 file as llama.cpp does (the last position's logits)."""

from __future__ import annotations

import ctypes

import gguf
import numpy as np
import pytest
import torch

import transformer_kit as tk
from testbed.dense_gguf import SHAPES, tensor_specs, write_dense_gguf

TINY = SHAPES["qwen2-tiny"]


def test_the_file_reads_back_as_the_shape_asked_for(tmp_path):
    reader = gguf.GGUFReader(write_dense_gguf(tmp_path / "tiny.gguf", TINY, "Q4_0"))
    fields = {key: reader.fields[f"qwen2.{key}"].contents()
              for key in ("block_count", "embedding_length", "feed_forward_length",
                          "attention.head_count", "attention.head_count_kv")}
    assert fields == {"block_count": 2, "embedding_length": 64, "feed_forward_length": 128,
                      "attention.head_count": 4, "attention.head_count_kv": 2}
    tensors = {t.name: t for t in reader.tensors}
    known = {gguf.TENSOR_NAMES[t].format(bid=n) for t in gguf.MODEL_TENSORS[gguf.MODEL_ARCH.QWEN2]
             for n in range(TINY.num_hidden_layers)}
    assert {name.rsplit(".", 1)[0] for name in tensors} <= known  # llama.cpp's qwen2 tensors
    specs = {s.name: s for s in tensor_specs(TINY, "Q4_0")}
    assert set(tensors) == set(specs)
    for name, tensor in tensors.items():
        assert tuple(int(d) for d in reversed(tensor.shape.tolist())) == specs[name].shape, name
        assert tensor.tensor_type == specs[name].qtype, name
    assert tensors["token_embd.weight"].tensor_type == gguf.GGMLQuantizationType.Q8_0  # the tied head


def test_llama_cpp_quantizes_to_the_same_types_and_the_kit_reads_the_file_as_llama_cpp(tmp_path):
    llama_cpp = pytest.importorskip("llama_cpp")
    f32 = write_dense_gguf(tmp_path / "f32.gguf", TINY, "F32")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = int(gguf.LlamaFileType.MOSTLY_Q4_0)
    params.nthread = 1
    assert llama_cpp.llama_model_quantize(str(f32).encode(), str(tmp_path / "theirs.gguf").encode(),
                                          ctypes.byref(params)) == 0
    theirs = {t.name: t.tensor_type for t in gguf.GGUFReader(tmp_path / "theirs.gguf").tensors}
    assert theirs == {s.name: s.qtype for s in tensor_specs(TINY, "Q4_0")}

    llm = llama_cpp.Llama(model_path=str(f32), n_threads=1, n_ctx=64, verbose=False)
    ids = llm.tokenize(b"Hello there, general", add_bos=False)
    llm.eval(ids)
    theirs = np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(llm.n_vocab(),)).copy()
    model = tk.from_gguf(f32).eval()
    with torch.no_grad():
        ours = model(torch.tensor([ids]))[0, -1].numpy()
    # llama.cpp keeps keys and values in float16: about 1e-4 of the largest logit apart
    np.testing.assert_allclose(ours, theirs, atol=1e-3 * np.abs(theirs).max())
    assert np.abs(ours - theirs).max() < 0.01 * np.abs(theirs - theirs.mean()).std()
