"""What tk.from_gguf refuses, each with a CheckpointError that says what was given and what to
do: a missing file, a file that is not GGUF, a truncated one, an architecture the kit does not
read, one whose family no plugin registers, a tensor type the dequantizer does not know."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
import transformers as hf

import transformer_kit as tk
from tests.checkpoints.gguf.writer import write_gguf


def _qwen3_file(tmp_path):
    torch.manual_seed(0)
    model = hf.Qwen3ForCausalLM(hf.Qwen3Config(
        vocab_size=40, hidden_size=32, intermediate_size=48, num_attention_heads=2,
        num_key_value_heads=1, num_hidden_layers=1, head_dim=16, max_position_embeddings=32,
        bos_token_id=1, eos_token_id=2))
    return write_gguf(model, tmp_path / "qwen3.gguf", "qwen3")


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(tk.CheckpointError, match=r"nothing\.gguf' does not exist; give a GGUF file"):
        tk.from_gguf(tmp_path / "nothing.gguf")


def test_a_file_that_is_not_gguf_is_refused_with_its_first_bytes(tmp_path):
    (tmp_path / "model.gguf").write_bytes(b"PK\x03\x04 a zip file")
    with pytest.raises(tk.CheckpointError, match=r"is not a GGUF file: it starts with b'PK\\x03\\x04'"):
        tk.from_gguf(tmp_path / "model.gguf")


def test_a_folder_is_pointed_to_from_hf(tmp_path):
    with pytest.raises(tk.CheckpointError, match=r"is a folder, not a GGUF file; .* use tk\.from_hf"):
        tk.from_gguf(tmp_path)


@pytest.mark.parametrize("keep", [0.3, 0.95])
def test_a_truncated_file_is_refused(tmp_path, keep):
    data = _qwen3_file(tmp_path).read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[:int(len(data) * keep)])
    with pytest.raises(tk.CheckpointError, match=r"Cannot read the GGUF file .*cut\.gguf' \(truncated"):
        tk.from_gguf(tmp_path / "cut.gguf")


def test_an_unknown_architecture_is_named_with_the_supported_ones(tmp_path):
    writer = gguf.GGUFWriter(tmp_path / "bloom.gguf", "bloom")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(tk.CheckpointError, match=r"GGUF architecture 'bloom' is not supported; the "
                       r"kit reads gemma, .*llama, .*qwen3"):
        tk.from_gguf(tmp_path / "bloom.gguf")


def test_an_architecture_without_a_family_gets_the_registrys_refusal(tmp_path, monkeypatch):
    path = _qwen3_file(tmp_path)
    monkeypatch.delitem(tk.get_registry()._families, "qwen3")
    with pytest.raises(tk.CheckpointError, match=r"qwen3\.gguf': model_type 'qwen3' is not supported "
                       r"by any installed plugin.* Supported: .*llama"):
        tk.from_gguf(path)


def test_rotary_frequency_factors_other_than_llama3s_are_refused_not_ignored(tmp_path):
    writer = gguf.GGUFWriter(tmp_path / "llama31.gguf", "llama")
    for add, value in ((writer.add_block_count, 1), (writer.add_embedding_length, 8),
                       (writer.add_head_count, 2)):
        add(value)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    writer.add_tensor("rope_freqs.weight", np.array([1, 3], np.float32))  # 1 then 3: not llama3
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(tk.CheckpointError, match=r"rope_freqs tensor .* that are not Llama 3's llama3 "
                       r"scaling is not supported; load the Hugging Face checkpoint with tk\.from_hf"):
        tk.from_gguf(tmp_path / "llama31.gguf")
