"""gpt-oss GGUF files (llama.cpp's ``gpt-oss`` architecture) as ``GptOssModel`` in
convert_hf_to_gguf.py writes them: the fused, interleaved ``gate_up_proj`` split into
``ffn_gate_exps`` and ``ffn_up_exps`` (with their ``.bias``), sinks, router bias, YaRN and the
sliding window in the metadata; the experts in F32 or in MXFP4 (the Hub's blocks repacked into
GGML's). The model equals transformers' GptOssForCausalLM it was written from (with the experts
transformers' ``convert_moe_packed_tensors`` dequantizes, for MXFP4), and its exports verify
with one MoE node per layer."""

from __future__ import annotations

import re

import gguf
import numpy as np
import pytest
import torch
import transformers as hf
from gguf import GGMLQuantizationType as Q
from transformers.integrations.mxfp4 import convert_moe_packed_tensors

import transformer_kit as tk
from tests.checkpoints.gguf.writer import mxfp4_to_ggml, write_gguf
from tests.plugins.families import moe_parity, parity
from transformer_kit.checkpoints.gguf.config import hf_config
from transformer_kit.checkpoints.gguf.file import open_gguf, read_metadata
from transformer_kit.checkpoints.gguf.tensors import hf_name
from transformer_kit.checkpoints.gguf.tokenizer import PRE_TOKENIZER_SPLITS
from transformer_kit.export import Int4, export_onnx

#: Every expert width a whole number of MXFP4 blocks (32 values).
_HIDDEN, _FF, _EXPERTS = 64, 32, 4


def _source(seed: int = 0, **extra) -> torch.nn.Module:
    """A random GptOssForCausalLM: 3 layers (sliding, full, sliding), YaRN, expert weights large
    enough that the SwiGLU clamp acts, biases, sinks and router spread, and embeddings and head
    spread enough that greedy decoding does not repeat one token."""
    torch.manual_seed(seed)
    config = hf.GptOssConfig(
        vocab_size=parity.VOCAB, hidden_size=_HIDDEN, intermediate_size=_FF, num_local_experts=_EXPERTS,
        num_experts_per_tok=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        num_hidden_layers=3, sliding_window=3, max_position_embeddings=64, bos_token_id=1,
        eos_token_id=2, pad_token_id=0,
        rope_parameters={"rope_type": "yarn", "factor": 4.0, "beta_fast": 16.0, "beta_slow": 2.0,
                         "truncate": False, "original_max_position_embeddings": 16,
                         "rope_theta": 1000.0}, **extra)
    model = parity.random_norms(hf.GptOssForCausalLM(config).eval())
    return moe_parity.spread_gpt_oss(model, also=("proj.bias", "embed_tokens.weight"), head_std=0.3)


def _ggml_to_hub(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """GGML's MXFP4 rows (..., rows, groups * 17) as the Hub's (blocks (..., rows, groups, 16),
    scales (..., rows, groups)): the inverse of :func:`mxfp4_to_ggml`, written apart from it."""
    data = rows.reshape(*rows.shape[:-1], -1, 17)
    scales, qs = data[..., 0], data[..., 1:]
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)  # values 0..15, then 16..31
    return codes[..., 0::2] | (codes[..., 1::2] << 4), scales


def _mxfp4_source(folder_seed: int = 1) -> tuple[torch.nn.Module, dict, dict]:
    """(the source with its experts replaced by what transformers dequantizes from MXFP4, the
    Hub's (blocks, scales) of each fused expert tensor, GGML's MXFP4 bytes gguf.quants wrote for
    each llama.cpp tensor). The MXFP4 values come from ``gguf.quants.quantize`` of the float
    experts, in the Hub's layout (gate and up rows interleaved) as gpt-oss's checkpoints hold
    them."""
    source = _source(folder_seed)
    hub, ggml = {}, {}
    with torch.no_grad():
        for name, param in source.named_parameters():
            if not name.endswith(("experts.gate_up_proj", "experts.down_proj")):
                continue
            rows = np.ascontiguousarray(param.numpy().swapaxes(1, 2))  # (experts, out, in)
            quantized = gguf.quants.quantize(rows, Q.MXFP4)
            blocks, scales = _ggml_to_hub(quantized)
            hub[name] = (blocks, scales)
            layer = name.split(".")[2]
            if name.endswith("gate_up_proj"):
                ggml[f"blk.{layer}.ffn_gate_exps.weight"] = quantized[:, 0::2]
                ggml[f"blk.{layer}.ffn_up_exps.weight"] = quantized[:, 1::2]
            else:
                ggml[f"blk.{layer}.ffn_down_exps.weight"] = quantized
            param.copy_(convert_moe_packed_tensors(torch.from_numpy(blocks), torch.from_numpy(scales),
                                                   dtype=torch.float32))
    return source, hub, ggml


def _shapes(reader) -> dict[str, tuple[int, ...]]:
    return {t.name: tuple(int(d) for d in reversed(t.shape.tolist())) for t in reader.tensors}


def test_the_file_equals_the_source_in_pytorch_and_its_export_verifies(tmp_path):
    source = _source()
    path = write_gguf(source, tmp_path / "model.gguf", "gpt-oss")
    model = tk.from_gguf(path)
    source.save_pretrained(tmp_path / "source")
    assert model.config == tk.config_from_hf(tmp_path / "source")
    assert model.config.layer_types == ["sliding_attention", "full_attention", "sliding_attention"]
    assert model.config.feedforward.params["expert"] == {
        "name": "swiglu", "bias": True, "alpha": 1.702, "limit": 7.0, "up_offset": 1.0}
    assert model.gguf_blocks == {}  # every tensor F32
    parity.check_pytorch(source, model)
    parity.check_onnxruntime(source, model, tmp_path / "onnx")  # the export verifies as it writes
    moe_parity.check_moe_nodes(model, tmp_path / "onnx")


def test_the_gpt_4o_pre_tokenizer_splits_as_o200k(tmp_path):
    """``tokenizer.ggml.pre`` gpt-4o (the converter's name of gpt-oss's o200k split): camel-case
    words apart, digits in threes, as transformers' GGUF tokenizer splits them."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_PRE_TOKENIZER_SPLITS

    assert PRE_TOKENIZER_SPLITS["gpt-4o"] == GGUF_PRE_TOKENIZER_SPLITS["gpt-4o"]
    model = tk.from_gguf(write_gguf(_source(), tmp_path / "model.gguf", "gpt-oss"))
    pieces = model.tokenizer.backend.pre_tokenizer.pre_tokenize_str("HelloWorld it's 12345")
    assert [piece for piece, _ in pieces] == ["Hello", "World", "Ġit's", "Ġ", "123", "45"]


def test_the_metadata_gives_the_gpt_oss_config(tmp_path):
    path = write_gguf(_source(), tmp_path / "model.gguf", "gpt-oss")
    reader = open_gguf(path)
    config = hf_config(read_metadata(reader), _shapes(reader))
    assert {k: config[k] for k in ("model_type", "num_local_experts", "num_experts_per_tok",
                                   "intermediate_size", "sliding_window", "layer_types",
                                   "attention_bias", "head_dim", "rope_scaling")} == {
        "model_type": "gpt_oss", "num_local_experts": 4, "num_experts_per_tok": 2,
        "intermediate_size": 32, "sliding_window": 3, "attention_bias": True, "head_dim": 16,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                         "beta_fast": 16.0, "beta_slow": 2.0, "truncate": False}}
    # the converter de-interleaves gate and up: GGUF's {d_model, d_ff, experts}, biases {d_ff, experts}
    shapes = {t.name: t.shape.tolist() for t in reader.tensors}
    assert shapes["blk.0.ffn_gate_exps.weight"] == [64, 32, 4]
    assert shapes["blk.0.ffn_up_exps.bias"] == [32, 4]
    assert shapes["blk.0.attn_sinks.weight"] == [4]


def test_mxfp4_experts_load_as_transformers_dequantizes_them(tmp_path):
    """The Hub's MXFP4 blocks repacked as the converter does are gguf.quants' own layout;
    dequantized by gguf.quants, expert by expert, they are bit for bit transformers'
    ``convert_moe_packed_tensors``; the logits equal transformers' with those experts."""
    source, hub, ggml = _mxfp4_source()
    path = write_gguf(source, tmp_path / "model.gguf", "gpt-oss", mxfp4=hub)
    reader = open_gguf(path)
    stored = {t.name: t for t in reader.tensors}
    for name, data in ggml.items():
        assert stored[name].tensor_type == Q.MXFP4
        np.testing.assert_array_equal(np.asarray(stored[name].data), data)
    model = tk.from_gguf(path)
    for i in range(3):
        experts, ours = source.model.layers[i].mlp.experts, model.decoder.layers[i].feedforward.experts
        for e in range(_EXPERTS):
            assert torch.equal(ours[e].gate.weight, experts.gate_up_proj[e, :, 0::2].T)
            assert torch.equal(ours[e].up.weight, experts.gate_up_proj[e, :, 1::2].T)
            assert torch.equal(ours[e].down.weight, experts.down_proj[e].T)
            assert torch.equal(ours[e].up.bias, experts.gate_up_proj_bias[e, 1::2])
    blocks = model.gguf_blocks["decoder.layers.2.feedforward.experts.3.up.weight"]
    assert (blocks.type_name, blocks.shape) == ("MXFP4", (_FF, _HIDDEN))
    np.testing.assert_array_equal(blocks.data, ggml["blk.2.ffn_up_exps.weight"][3])
    parity.check_pytorch(source, model)


def test_the_hub_layout_repacks_into_ggml_mxfp4():
    """:func:`mxfp4_to_ggml` (the converter's repacking) against gguf.quants: random bytes in
    the Hub's layout, repacked, dequantize to what transformers reads from them."""
    rng = np.random.default_rng(0)
    blocks = rng.integers(0, 256, (2, 3, 4, 16), dtype=np.uint8)
    scales = rng.integers(100, 150, (2, 3, 4), dtype=np.uint8)
    ours = gguf.quants.dequantize(mxfp4_to_ggml(blocks, scales), Q.MXFP4)  # (2, 3, 128)
    theirs = convert_moe_packed_tensors(torch.from_numpy(blocks), torch.from_numpy(scales),
                                        dtype=torch.float32)  # (2, 128, 3): (experts, in, out)
    assert torch.equal(torch.from_numpy(ours), theirs.transpose(1, 2))


def test_mxfp4_experts_export_to_int4_quantized_here_loaded_or_streamed(tmp_path):
    """QMoE has no layout for MXFP4 (an E2M1 code times a power of two): the int4 export quantizes
    the dequantized experts itself, says so for each, and verifies with one QMoE per layer; from
    the file streamed (``stream=True``: each expert dequantized as it is written) it writes the
    same bytes."""
    source, hub, _ = _mxfp4_source()
    path = write_gguf(source, tmp_path / "model.gguf", "gpt-oss", mxfp4=hub)
    model = tk.from_gguf(path)
    reports = {name: export_onnx(loaded, tmp_path / name, quantize=Int4(accuracy_level=1))
               for name, loaded in (("loaded", model), ("streamed", tk.from_gguf(path, stream=True)))}
    experts = {name: origin for name, origin in reports["loaded"].weight_origins.items()
               if ".experts." in name}
    assert len(experts) == 3 * _EXPERTS * 3
    assert set(experts.values()) == {"quantized here (GGUF MXFP4 has no exact MatMulNBits layout)"}
    moe_parity.check_moe_nodes(model, tmp_path / "loaded")
    assert reports["streamed"].weight_origins == reports["loaded"].weight_origins
    for file in sorted(p.name for p in (tmp_path / "loaded").iterdir() if p.suffix in (".onnx", ".data")):
        assert (tmp_path / "loaded" / file).read_bytes() == (tmp_path / "streamed" / file).read_bytes(), file


@pytest.mark.parametrize(("key", "value"), [("attention.sliding_window", None),
                                            ("attention.sliding_window", 0),
                                            ("rope.scaling.yarn_attn_factor", 1.5),
                                            ("rope.scaling.yarn_ext_factor", 0.5),
                                            ("rope.scaling.yarn_log_multiplier", 0.1)])
def test_metadata_the_kit_does_not_map_is_refused_naming_the_field(tmp_path, key, value):
    reader = open_gguf(write_gguf(_source(), tmp_path / "model.gguf", "gpt-oss"))
    meta = {**read_metadata(reader), f"gpt-oss.{key}": value}
    with pytest.raises(tk.CheckpointError, match=f"gpt-oss GGUF file with {re.escape(key)} {value}"):
        hf_config(meta, _shapes(reader))


def test_the_router_metadata_llama_cpp_ignores_for_gpt_oss_is_ignored(tmp_path):
    """llama.cpp's gpt-oss graph always routes by the softmax of the top-k logits, unscaled:
    ``expert_gating_func`` and ``expert_weights_scale`` are not read, so not refused."""
    reader = open_gguf(write_gguf(_source(), tmp_path / "model.gguf", "gpt-oss"))
    meta = {**read_metadata(reader), "gpt-oss.expert_gating_func": 3, "gpt-oss.expert_weights_scale": 2.0}
    assert hf_config(meta, _shapes(reader))["num_experts_per_tok"] == 2


def test_fused_gate_up_experts_of_newer_converters_are_refused_naming_them():
    name = "blk.0.ffn_gate_up_exps.weight"
    with pytest.raises(tk.CheckpointError, match=f"holds a tensor '{re.escape(name)}'"):
        hf_name(name, "gpt-oss")
