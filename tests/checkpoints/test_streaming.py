"""Checkpoints read tensor by tensor: from_hf's dtype and stream options, exports that stream
their weights from the checkpoint (the same files as from a model in memory), bounded memory,
and shards or tensors that are missing named."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
import transformers as hf

import transformer_kit as tk
from testbed.random_checkpoints import write_random_checkpoint
from tests.plugins.families.parity import VOCAB
from transformer_kit.checkpoints import streaming
from transformer_kit.export import Int4, export_onnx
from transformer_kit.runtime import OnnxModel


@pytest.fixture(scope="module")
def bfloat16_checkpoint(tmp_path_factory):
    """A random Qwen2 (biases on q, k, v; tied head) saved in bfloat16 in several shards."""
    torch.manual_seed(0)
    reference = hf.Qwen2ForCausalLM(hf.Qwen2Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_attention_heads=4,
        num_key_value_heads=2, num_hidden_layers=2, max_position_embeddings=64, pad_token_id=0,
        tie_word_embeddings=True)).to(torch.bfloat16).eval()
    folder = tmp_path_factory.mktemp("qwen2-bf16")
    reference.save_pretrained(folder, max_shard_size="20KB")
    assert (folder / "model.safetensors.index.json").is_file()
    return reference, folder


def test_dtype_keeps_the_checkpoints_bfloat16_values(bfloat16_checkpoint):
    reference, folder = bfloat16_checkpoint
    exact = tk.from_hf(folder)
    kept = tk.from_hf(folder, dtype="auto")
    assert {p.dtype for p in exact.parameters()} == {torch.float32}
    assert {p.dtype for p in kept.parameters()} == {torch.bfloat16}
    floats = dict(exact.named_parameters())
    for name, param in kept.named_parameters():
        assert torch.equal(param, floats[name].to(torch.bfloat16)), name  # bfloat16 -> float32 is exact
    assert kept.head.weight is kept.embed.token.weight  # still tied
    assert torch.equal(kept.embed.token.weight, reference.model.embed_tokens.weight)
    with pytest.raises(tk.InputError, match=r"dtype='int8' is not supported; choose one of float32"):
        tk.from_hf(folder, dtype="int8")


@pytest.mark.parametrize("quantize", [None, Int4(block_size=16)], ids=["float32", "int4"])
def test_a_streamed_export_writes_what_an_export_from_memory_writes(bfloat16_checkpoint, tmp_path,
                                                                    quantize, monkeypatch):
    _, folder = bfloat16_checkpoint
    monkeypatch.setattr(streaming, "STREAMED_MIN_ELEMENTS", 0)  # every layer read as it runs
    in_memory = export_onnx(tk.from_hf(folder), tmp_path / "memory", quantize=quantize)
    streamed = export_onnx(tk.from_hf(folder, stream=True), tmp_path / "streamed", quantize=quantize)
    assert streamed.reference == "PyTorch float32, each layer's weights read as it runs"
    assert in_memory.reference == "PyTorch float32, in memory"
    assert streamed.errors == pytest.approx(in_memory.errors, rel=1e-3, abs=1e-7)
    assert streamed.tokens_match and in_memory.tokens_match
    for file in ("weights.data", "model.onnx", "decoder_step.onnx"):
        assert (tmp_path / "memory" / file).read_bytes() == (tmp_path / "streamed" / file).read_bytes()


def test_a_streamed_model_does_not_run_in_pytorch_but_says_so(bfloat16_checkpoint):
    _, folder = bfloat16_checkpoint
    model = tk.from_hf(folder, stream=True)
    assert {p.device.type for p in model.parameters()} == {"meta"}
    with pytest.raises(tk.InputError, match=r"loaded with stream=True.*Load it without stream=True"):
        model(torch.tensor([[3, 4, 5]]))
    with pytest.raises(tk.InputError, match=r"loaded with stream=True"):
        model.generate(torch.tensor([[3, 4, 5]]), 2)


def test_missing_shards_and_tensors_are_named(bfloat16_checkpoint, tmp_path):
    _, folder = bfloat16_checkpoint
    broken = tmp_path / "broken"
    broken.mkdir()
    for path in folder.iterdir():
        (broken / path.name).write_bytes(path.read_bytes())
    index = json.loads((broken / "model.safetensors.index.json").read_text())
    shard = index["weight_map"]["model.layers.1.mlp.up_proj.weight"]
    (broken / shard).unlink()
    with pytest.raises(tk.CheckpointError, match=rf"names the shard '{re.escape(shard)}' for \d+ tensors "
                       r"\(.*\), but that file is missing"):
        tk.from_hf(broken, stream=True)
    (broken / shard).write_bytes((folder / shard).read_bytes())
    index["weight_map"].pop("model.layers.1.mlp.up_proj.weight")
    (broken / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(tk.CheckpointError, match=r"lack 'model.layers.1.mlp.up_proj.weight'"):
        tk.from_hf(broken)


def test_stream_needs_safetensors(tmp_path):
    torch.manual_seed(0)
    reference = hf.LlamaForCausalLM(hf.LlamaConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_attention_heads=4,
        num_key_value_heads=2, num_hidden_layers=1, max_position_embeddings=64))
    reference.config.save_pretrained(tmp_path)
    torch.save(reference.state_dict(), tmp_path / "pytorch_model.bin")
    with pytest.raises(tk.CheckpointError, match=r"stream=True reads safetensors checkpoints"):
        tk.from_hf(tmp_path, stream=True)


MEASURE = textwrap.dedent("""
    import re, sys
    from pathlib import Path

    def status(key):
        return int(re.search(key + r":\\s+(\\d+) kB", Path("/proc/self/status").read_text()).group(1)) * 1024

    import transformer_kit as tk
    from transformer_kit.export import export_onnx
    import transformer_kit.export.exporter, transformer_kit.export.verify  # imports before the baseline
    base = status("VmRSS")
    model = tk.from_hf(sys.argv[1], stream=True)
    report = export_onnx(model, sys.argv[2], quantize="int4", verify=False)
    print(base, status("VmHWM"), report.folder_bytes)
""")


def test_an_exports_peak_memory_is_bounded_by_the_checkpoints_bytes(tmp_path):
    """A 100M-parameter bfloat16 checkpoint (199 MB) exported to int4 in a process of its own:
    the export's peak resident memory above the process's after its imports stays under 2.5x the
    checkpoint's bytes (it was 17 bytes a parameter, 8.5x, when whole graphs held their weights;
    about 1.9x now, most of it tracing, which does not grow with the weights; the default's
    calibration runs before it and gives its memory back)."""
    weight_bytes = write_random_checkpoint(tmp_path / "ckpt", "llama-100m")
    run = subprocess.run([sys.executable, "-c", MEASURE, str(tmp_path / "ckpt"), str(tmp_path / "onnx")],
                         capture_output=True, text=True, timeout=600, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    base, peak, folder_bytes = map(int, run.stdout.split()[-3:])
    assert peak - base < 2.5 * weight_bytes, f"peak {peak / 1e6:.0f} MB, base {base / 1e6:.0f} MB"
    # the default int4: 4-bit blocks with scales and zero points, the embedding (untied: the
    # head too) and feed-forward output projections in 8 bits: 6.6 bits a weight (0.41x the
    # bfloat16 bytes)
    assert folder_bytes < 0.45 * weight_bytes
    ids = np.array([[5, 6, 7, 8]])
    assert OnnxModel(tmp_path / "onnx").generate(ids, 3).shape == (1, 3)
