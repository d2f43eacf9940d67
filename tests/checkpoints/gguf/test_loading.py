"""tk.from_gguf on small random checkpoints written as llama.cpp writes them (writer.py): the
model equals transformers' own loading of the same file (llama, qwen2, qwen3), or the source
checkpoint where every tensor is stored as float (gemma, olmo2, which transformers does not
read from GGUF); quantized matrices are dequantized and kept as GgufBlocks."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
import transformers as hf

import transformer_kit as tk
from tests.checkpoints.gguf.writer import write_gguf
from transformer_kit.checkpoints.gguf import GgufBlocks
from transformer_kit.export.verify import relative_error

Q = gguf.GGMLQuantizationType
VOCAB = 61
TOLERANCE = 1e-4


def _random_norms(model: torch.nn.Module) -> torch.nn.Module:
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
    return model.eval()


def _sizes(**extra) -> dict:
    return dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_attention_heads=4,
                num_key_value_heads=2, num_hidden_layers=2, max_position_embeddings=64,
                bos_token_id=1, eos_token_id=2, **extra)


MODELS = {
    "llama": lambda: hf.LlamaForCausalLM(hf.LlamaConfig(**_sizes(rope_theta=5e4))),
    # Llama 3.1's rotary scaling, which llama.cpp writes as a rope_freqs tensor of factors
    "llama3.1": lambda: hf.LlamaForCausalLM(hf.LlamaConfig(**_sizes(rope_parameters={
        "rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}))),
    "qwen2": lambda: hf.Qwen2ForCausalLM(hf.Qwen2Config(**_sizes(tie_word_embeddings=True))),
    # head_dim 128: transformers reads no head_dim for qwen3 from GGUF, it takes its default
    "qwen3": lambda: hf.Qwen3ForCausalLM(hf.Qwen3Config(**_sizes(head_dim=128))),
    "gemma": lambda: hf.GemmaForCausalLM(hf.GemmaConfig(**_sizes(head_dim=16))),
    "olmo2": lambda: hf.Olmo2ForCausalLM(hf.Olmo2Config(**_sizes(pad_token_id=0))),
}
#: Stored quantized (the rest: F32): a query and a key matrix (rows permuted by llama.cpp for
#: llama), a feed-forward matrix, and the embedding.
QUANTIZED = {"blk.0.attn_q.weight": Q.Q8_0, "blk.1.attn_k.weight": Q.Q4_0,
             "blk.0.ffn_down.weight": Q.Q8_0, "token_embd.weight": Q.Q8_0}
#: The architectures transformers reads from GGUF itself.
READ_BY_TRANSFORMERS = ("llama", "qwen2", "qwen3")


def _make(arch: str) -> torch.nn.Module:
    torch.manual_seed(sum(map(ord, arch)))
    return _random_norms(MODELS[arch]())


def _batch(pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(3, VOCAB - 2, (3, 9), generator=torch.Generator().manual_seed(0))
    ids[1, 6:] = pad
    ids[2, 4:] = pad
    return ids, (ids != pad).long()


def _error(reference: torch.nn.Module, model: tk.TransformerModel) -> float:
    ids, mask = _batch(model.config.pad_id)
    with torch.no_grad():
        expected = reference(input_ids=ids, attention_mask=mask).logits
        ours = model(ids, attention_mask=mask)
    real = mask.bool()
    return relative_error(ours[real].numpy(), expected[real].numpy())


@pytest.mark.parametrize("arch", READ_BY_TRANSFORMERS)
def test_quantized_file_equals_transformers_loading_it(arch, tmp_path):
    path = write_gguf(_make(arch), tmp_path / "model.gguf", arch, QUANTIZED)
    reference = hf.AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="model.gguf",
                                                        dtype=torch.float32).eval()
    model = tk.from_gguf(path, pad_id=0)
    assert _error(reference, model) <= TOLERANCE


@pytest.mark.parametrize("arch", sorted(MODELS))
def test_float_file_equals_the_source_checkpoint(arch, tmp_path):
    source = _make(arch)
    model = tk.from_gguf(write_gguf(source, tmp_path / "model.gguf", arch.removesuffix("3.1")), pad_id=0)
    assert model.config.model_dump() == tk.config_from_gguf(tmp_path / "model.gguf", pad_id=0).model_dump()
    assert _error(source, model) <= TOLERANCE
    assert model.gguf_blocks == {}  # nothing stored quantized


def test_llama3_scaling_is_read_back_from_the_rope_freqs_factors(tmp_path):
    path = write_gguf(_make("llama3.1"), tmp_path / "model.gguf", "llama")
    scaling = tk.config_from_gguf(path, pad_id=0).positional.params["scaling"]
    assert scaling == {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": 8192}


def test_blocks_are_the_files_rows_in_the_kits_order(tmp_path):
    path = write_gguf(_make("llama"), tmp_path / "model.gguf", "llama", QUANTIZED)
    model = tk.from_gguf(path, pad_id=0)
    params = dict(model.named_parameters())
    assert sorted(model.gguf_blocks) == sorted([
        "decoder.layers.0.self_attention.q_proj.weight", "decoder.layers.1.self_attention.k_proj.weight",
        "decoder.layers.0.feedforward.down.weight", "embed.token.weight"])
    for name, blocks in model.gguf_blocks.items():
        assert isinstance(blocks, GgufBlocks) and blocks.data.dtype == np.uint8
        assert blocks.shape == tuple(params[name].shape) and blocks.data.shape[0] == blocks.shape[0]
        values = gguf.quants.dequantize(blocks.data, Q[blocks.type_name])
        np.testing.assert_array_equal(values, params[name].detach().numpy())
    assert model.gguf_blocks["decoder.layers.1.self_attention.k_proj.weight"].type_name == "Q4_0"


def test_a_tied_head_shares_the_embeddings_blocks(tmp_path):
    path = write_gguf(_make("qwen2"), tmp_path / "model.gguf", "qwen2", {"token_embd.weight": Q.Q8_0})
    model = tk.from_gguf(path, pad_id=0)
    assert model.config.tie_embeddings
    assert model.gguf_blocks["head.weight"] is model.gguf_blocks["embed.token.weight"]


def test_the_tokenizer_and_chat_template_come_from_the_metadata(tmp_path):
    model = tk.from_gguf(write_gguf(_make("llama"), tmp_path / "model.gguf", "llama"), pad_id=0)
    ids, _ = model.tokenizer.encode(['#$<|im_end|>!"!'])  # "!" is id 3, '!"' the merge
    assert ids.tolist() == [[5, 6, 2, VOCAB - 1, 3]]
    prompt = model.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}],
                                                 add_generation_prompt=False)
    assert prompt == "<|im_start|>hi<|im_end|>"
    assert model.tokenizer.decode([2, 3, 4]) == '!"'  # the special token skipped
