"""GGUF files of mixture-of-experts architectures (qwen3moe, qwen2moe, olmoe, Mixtral as llama
with experts, granitemoe) as llama.cpp's converter writes them: the experts stacked per layer
(``ffn_{gate,up,down}_exps``), read one expert at a time into the ``moe`` component; the model
equals transformers' on a padded batch, its export verifies with one MoE node per sparse
layer, and quantized experts load as their own dequantized values."""

from __future__ import annotations

import re

import gguf
import numpy as np
import pytest
import torch
import transformers as hf
from gguf import GGMLQuantizationType as Q

import transformer_kit as tk
from tests.checkpoints.gguf.writer import write_gguf
from tests.plugins.families import moe_parity, parity
from transformer_kit.checkpoints.gguf.config import hf_config
from transformer_kit.checkpoints.gguf.file import open_gguf, read_metadata
from transformer_kit.checkpoints.gguf.tensors import hf_name
from transformer_kit.export import Int4, export_onnx

# transformers builds a shared expert of width 0 (none) as empty linears, and says so
pytestmark = pytest.mark.filterwarnings("ignore:Initializing zero-element tensors:UserWarning")

#: Widths that are whole blocks of Q8_0 and Q4_0 (32 values) along every expert's rows.
_SIZES = dict(vocab_size=parity.VOCAB, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
              num_hidden_layers=2, max_position_embeddings=64, bos_token_id=1, eos_token_id=2,
              pad_token_id=0)
_GRANITE = dict(attention_multiplier=0.3, embedding_multiplier=2.0, residual_multiplier=0.5,
                logits_scaling=4.0)
#: GGUF architecture (and a label) -> (a random source checkpoint, its model_type).
SOURCES = {
    # norm_topk_prob as llama.cpp computes each: qwen3moe always renormalises, qwen2moe and
    # olmoe never (see transformer_kit.checkpoints.gguf.config._MOE)
    "qwen3moe": (lambda: hf.Qwen3MoeForCausalLM(hf.Qwen3MoeConfig(
        **_SIZES, intermediate_size=96, moe_intermediate_size=32, num_experts=6,
        num_experts_per_tok=2, norm_topk_prob=True)), "qwen3_moe"),
    "qwen2moe": (lambda: hf.Qwen2MoeForCausalLM(hf.Qwen2MoeConfig(
        **_SIZES, intermediate_size=96, moe_intermediate_size=32, shared_expert_intermediate_size=64,
        num_experts=4, num_experts_per_tok=2, tie_word_embeddings=True)), "qwen2_moe"),
    "olmoe": (lambda: hf.OlmoeForCausalLM(hf.OlmoeConfig(
        **_SIZES, intermediate_size=32, num_experts=5, num_experts_per_tok=3)), "olmoe"),
    "llama": (lambda: hf.MixtralForCausalLM(hf.MixtralConfig(
        **_SIZES, intermediate_size=64, num_local_experts=4, num_experts_per_tok=2)), "mixtral"),
    "granitemoe": (lambda: hf.GraniteMoeForCausalLM(hf.GraniteMoeConfig(
        **_SIZES, intermediate_size=32, num_local_experts=4, num_experts_per_tok=1, **_GRANITE)),
                   "granitemoe"),
    "granitemoe+shared": (lambda: hf.GraniteMoeSharedForCausalLM(hf.GraniteMoeSharedConfig(
        **_SIZES, intermediate_size=32, shared_intermediate_size=64, num_local_experts=4,
        num_experts_per_tok=2, tie_word_embeddings=True, **_GRANITE)), "granitemoeshared"),
}


def _source(label: str) -> torch.nn.Module:
    torch.manual_seed(sum(map(ord, label)))
    return parity.random_norms(SOURCES[label][0]().eval())


def _written(label: str, folder, quantized=None):
    source = _source(label)
    path = write_gguf(source, folder / "model.gguf", label.split("+")[0], quantized)
    return source, path


@pytest.mark.parametrize("label", sorted(SOURCES))
def test_the_file_equals_the_source_in_pytorch_and_its_export_verifies(label, tmp_path):
    source, path = _written(label, tmp_path)
    model = tk.from_gguf(path)
    source.save_pretrained(tmp_path / "source")
    assert model.config == tk.config_from_hf(tmp_path / "source")
    assert model.config.feedforward.name == "moe"
    parity.check_pytorch(source, model)
    parity.check_onnxruntime(source, model, tmp_path / "onnx")  # the export verifies as it writes
    moe_parity.check_moe_nodes(model, tmp_path / "onnx")


def test_the_metadata_gives_the_expert_config(tmp_path):
    _, path = _written("qwen2moe", tmp_path)
    reader = open_gguf(path)
    config = hf_config(read_metadata(reader), {t.name: tuple(reversed(t.shape.tolist()))
                                               for t in reader.tensors})
    assert {k: config[k] for k in ("model_type", "num_experts", "num_experts_per_tok",
                                   "moe_intermediate_size", "shared_expert_intermediate_size",
                                   "norm_topk_prob", "qkv_bias")} == {
        "model_type": "qwen2_moe", "num_experts": 4, "num_experts_per_tok": 2,
        "moe_intermediate_size": 32, "shared_expert_intermediate_size": 64,
        "norm_topk_prob": False, "qkv_bias": True}
    # the stacked experts: GGUF's dims innermost first, {d_model, d_ff, experts}
    shapes = {t.name: t.shape.tolist() for t in reader.tensors}
    assert shapes["blk.0.ffn_gate_exps.weight"] == [64, 32, 4]
    assert shapes["blk.0.ffn_down_exps.weight"] == [32, 64, 4]


def test_qwen3moe_dense_layers_map_to_mlp_only_layers(tmp_path):
    """A layer without ``ffn_gate_inp`` keeps its dense SwiGLU (transformers' mlp_only_layers;
    llama.cpp itself asks every qwen3moe layer for experts)."""
    torch.manual_seed(0)
    source = parity.random_norms(hf.Qwen3MoeForCausalLM(hf.Qwen3MoeConfig(
        **_SIZES, intermediate_size=96, moe_intermediate_size=32, num_experts=4,
        num_experts_per_tok=2, norm_topk_prob=True, mlp_only_layers=[1])).eval())
    model = tk.from_gguf(write_gguf(source, tmp_path / "model.gguf", "qwen3moe"))
    assert model.config.layer_types == ["sparse", "dense"]
    parity.check_pytorch(source, model)


def _dequantized(source: torch.nn.Module, quantized: dict[str, Q]) -> torch.nn.Module:
    """``source`` with each fused expert tensor replaced by its values after the round trip
    through the GGUF types in ``quantized`` (keyed by llama.cpp's name)."""
    with torch.no_grad():
        for name, param in source.named_parameters():
            if ".experts." not in name:
                continue
            layer = name.split(".")[2]
            parts = (["ffn_gate_exps", "ffn_up_exps"] if name.endswith("gate_up_proj") else ["ffn_down_exps"])
            values = []
            for part, data in zip(parts, np.split(param.numpy(), len(parts), axis=1), strict=True):
                kind = quantized[f"blk.{layer}.{part}.weight"]
                stored = gguf.quants.quantize(np.ascontiguousarray(data), kind)
                values.append(gguf.quants.dequantize(stored, kind))
            param.copy_(torch.from_numpy(np.concatenate(values, axis=1)))
    return source


def test_quantized_experts_load_as_their_dequantized_values_and_keep_their_blocks(tmp_path):
    quantized = {}
    for i in range(2):
        quantized |= {f"blk.{i}.ffn_gate_exps.weight": Q.Q4_0, f"blk.{i}.ffn_up_exps.weight": Q.Q4_0,
                      f"blk.{i}.ffn_down_exps.weight": Q.Q8_0}
    source, path = _written("qwen3moe", tmp_path, quantized)
    model = tk.from_gguf(path)
    reader = open_gguf(path)
    stacked = {t.name: t for t in reader.tensors}["blk.1.ffn_down_exps.weight"]
    expected = gguf.quants.dequantize(np.asarray(stacked.data), Q.Q8_0)  # (experts, d_model, d_ff)
    moe = model.decoder.layers[1].feedforward
    for e in range(6):
        assert torch.equal(moe.experts[e].down.weight, torch.from_numpy(expected[e]))
    blocks = model.gguf_blocks["decoder.layers.1.feedforward.experts.5.gate.weight"]
    assert (blocks.type_name, blocks.shape) == ("Q4_0", (32, 64))
    np.testing.assert_array_equal(blocks.data, np.asarray(
        {t.name: t for t in reader.tensors}["blk.1.ffn_gate_exps.weight"].data)[5])
    parity.check_pytorch(_dequantized(source, quantized), model)


@pytest.mark.parametrize(("key", "value"), [("expert_weights_scale", 2.5), ("expert_gating_func", 2),
                                            ("expert_used_count", 0)])
def test_routing_the_kit_does_not_map_is_refused_naming_the_field(tmp_path, key, value):
    _, path = _written("qwen3moe", tmp_path)
    reader = open_gguf(path)
    meta = {**read_metadata(reader), f"qwen3moe.{key}": value}
    with pytest.raises(tk.CheckpointError, match=f"qwen3moe GGUF file with .*{key} {value}"):
        hf_config(meta, {t.name: tuple(reversed(t.shape.tolist())) for t in reader.tensors})


def test_an_olmoe_layer_without_experts_is_refused(tmp_path):
    _, path = _written("olmoe", tmp_path)
    reader = open_gguf(path)
    shapes = {t.name: tuple(reversed(t.shape.tolist())) for t in reader.tensors}
    del shapes["blk.1.ffn_gate_inp.weight"]
    with pytest.raises(tk.CheckpointError, match=r"olmoe GGUF file with layers without experts .*\[1\]"):
        hf_config(read_metadata(reader), shapes)


@pytest.mark.parametrize("name", ["blk.0.ffn_gate.3.weight", "blk.0.ffn_gate_up_exps.weight"])
def test_old_per_expert_and_fused_gate_up_tensors_are_refused_naming_them(name):
    """Mixtral files from before llama.cpp stacked the experts (``ffn_gate.E``), and the fused
    ``ffn_gate_up_exps`` of newer converters, are not read."""
    with pytest.raises(tk.CheckpointError, match=f"holds a tensor '{re.escape(name)}'"):
        hf_name(name, "llama")


def test_q4_0_experts_reach_the_int4_export_as_the_files_own_blocks(tmp_path):
    """Every expert in Q4_0: the int4 export writes each layer's QMoE from the file's blocks
    (not quantized again), and verifies."""
    quantized = {f"blk.{i}.ffn_{part}_exps.weight": Q.Q4_0
                 for i in range(2) for part in ("gate", "up", "down")}
    _, path = _written("qwen3moe", tmp_path, quantized)
    model = tk.from_gguf(path)
    report = export_onnx(model, tmp_path / "int4", quantize=Int4(accuracy_level=1))
    experts = {name: origin for name, origin in report.weight_origins.items() if ".experts." in name}
    assert len(experts) == 2 * 6 * 3 and set(experts.values()) == {"GGUF Q4_0 blocks"}
    moe_parity.check_moe_nodes(model, tmp_path / "int4")


def test_a_streamed_gguf_model_exports_what_the_loaded_one_does(tmp_path):
    """``from_gguf(stream=True)``: the weights stay in the file (parameters on the meta device)
    and the int4 export, verified, writes the same bytes as the export of the loaded model."""
    quantized = {f"blk.{i}.ffn_{part}_exps.weight": Q.Q4_0
                 for i in range(2) for part in ("gate", "up", "down")}
    _, path = _written("qwen3moe", tmp_path, quantized)
    streamed = tk.from_gguf(path, stream=True)
    assert {p.device.type for p in streamed.parameters()} == {"meta"}
    reports = {name: export_onnx(model, tmp_path / name, quantize=Int4(accuracy_level=1))
               for name, model in (("loaded", tk.from_gguf(path)), ("streamed", streamed))}
    assert reports["streamed"].reference == "PyTorch float32, each layer's weights read as it runs"
    assert reports["streamed"].weight_origins == reports["loaded"].weight_origins
    for file in sorted(p.name for p in (tmp_path / "loaded").iterdir() if p.suffix in (".onnx", ".data")):
        assert (tmp_path / "loaded" / file).read_bytes() == (tmp_path / "streamed" / file).read_bytes(), file
