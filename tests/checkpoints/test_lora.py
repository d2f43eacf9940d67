"""PEFT LoRA adapters merged at loading (``tk.from_hf(base, adapter=DIR)``): the merged model in
PyTorch and its onnxruntime export equal PEFT's model with the adapter (logits, greedy and beam
tokens); options PEFT's scale depends on (rsLoRA, rank and alpha patterns, GPT-2's fused
fan_in_fan_out layers); every variant that is not a low-rank sum on a linear layer refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import peft
import pytest
import torch
import transformers as hf
from safetensors.torch import load_file, save_file

import transformer_kit as tk
from tests.plugins.families.parity import VOCAB, check_generation
from transformer_kit.export import export_onnx
from transformer_kit.export.verify import relative_error
from transformer_kit.runtime import OnnxModel

LLAMA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _llama(folder: Path, seed: int = 0) -> hf.PreTrainedModel:
    torch.manual_seed(seed)
    model = hf.LlamaForCausalLM(hf.LlamaConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=38, num_attention_heads=4,
        num_key_value_heads=2, num_hidden_layers=2, max_position_embeddings=64, bos_token_id=1,
        eos_token_id=2, pad_token_id=0)).eval()
    model.save_pretrained(folder)
    return model


def _adapter(base: hf.PreTrainedModel, folder: Path, seed: int = 1, save_embedding_layers="auto",
             **options) -> peft.PeftModel:
    """A random PEFT LoRA on ``base`` (B non-zero: init_lora_weights=False), saved in ``folder``."""
    torch.manual_seed(seed)
    options = {"r": 4, "lora_alpha": 8, "target_modules": LLAMA_TARGETS, **options}
    model = peft.get_peft_model(base, peft.LoraConfig(init_lora_weights=False, **options)).eval()
    with torch.no_grad():  # PEFT's random init is small; larger B makes the adapter's effect plain
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.mul_(20)
    model.save_pretrained(folder, save_embedding_layers=save_embedding_layers)
    return model


def _ids() -> torch.Tensor:
    return torch.randint(3, VOCAB, (3, 7), generator=torch.Generator().manual_seed(2))


def test_a_merged_adapter_equals_peft_in_pytorch_and_onnxruntime(tmp_path):
    base = _llama(tmp_path / "base")
    ids = _ids()
    with torch.no_grad():
        base_logits = base(input_ids=ids).logits
    reference = _adapter(base, tmp_path / "adapter")
    model = tk.from_hf(tmp_path / "base", adapter=tmp_path / "adapter")
    with torch.no_grad():
        expected = reference(input_ids=ids).logits
        assert relative_error(expected, base_logits) > 0.05  # the adapter changes the outputs
        assert relative_error(model(ids), expected) <= 1e-4
    export_onnx(model, tmp_path / "onnx")
    om = OnnxModel(tmp_path / "onnx")
    assert relative_error(om(ids.numpy()), expected.numpy()) <= 1e-4
    check_generation(reference, model, om)  # greedy and beam tokens: PEFT's generate
    streamed = tk.from_hf(tmp_path / "base", adapter=tmp_path / "adapter", stream=True)
    export_onnx(streamed, tmp_path / "streamed", verify=False)
    assert relative_error(OnnxModel(tmp_path / "streamed")(ids.numpy()), expected.numpy()) <= 1e-4


@pytest.mark.parametrize("options", [
    {"use_rslora": True},
    {"rank_pattern": {"v_proj": 2, "layers.1.mlp.down_proj": 6}, "alpha_pattern": {"q_proj": 3}},
])
def test_the_scale_follows_rslora_and_the_rank_and_alpha_patterns(tmp_path, options):
    base = _llama(tmp_path / "base")
    reference = _adapter(base, tmp_path / "adapter", **options)
    model = tk.from_hf(tmp_path / "base", adapter=tmp_path / "adapter")
    with torch.no_grad():
        assert relative_error(model(_ids()), reference(input_ids=_ids()).logits) <= 1e-4


def test_gpt2s_fused_fan_in_fan_out_attention_is_merged_before_it_is_split(tmp_path):
    torch.manual_seed(0)
    base = hf.GPT2LMHeadModel(hf.GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=16, n_layer=2,
                                            n_head=2, bos_token_id=1, eos_token_id=2)).eval()
    base.save_pretrained(tmp_path / "base")
    reference = _adapter(base, tmp_path / "adapter", target_modules=["c_attn", "c_proj", "c_fc"],
                         fan_in_fan_out=True)
    model = tk.from_hf(tmp_path / "base", adapter=tmp_path / "adapter")
    with torch.no_grad():
        assert relative_error(model(_ids()), reference(input_ids=_ids()).logits) <= 1e-4
    apart = tk.from_hf(tmp_path / "base", adapters={"tuned": tmp_path / "adapter"})
    merged, weights = model.state_dict(), apart.state_dict()
    factors = apart.adapters["tuned"]  # the fused c_attn as q, k, v factors: each its own rows
    assert {n.rsplit(".", 2)[-2] for n in factors} == {"q_proj", "k_proj", "v_proj", "o_proj", "linear1",
                                                      "linear2"}
    for name, (a, b) in factors.items():
        assert torch.allclose(weights[name] + b @ a, merged[name], atol=1e-6), name


def _edit(folder: Path, **config) -> None:
    path = folder / "adapter_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **config}))


@pytest.mark.parametrize(("config", "refused"), [
    ({"use_dora": True}, r"use_dora=True is not supported"),
    ({"bias": "lora_only"},
     r"bias='lora_only' is not supported; the kit merges adapters trained with bias='none'"),
    ({"modules_to_save": ["lm_head"]}, r"modules_to_save=\['lm_head'\] is not supported"),
    ({"init_lora_weights": "pissa"},
     r"init_lora_weights='pissa' is not supported; such an initialization changes the base"),
    ({"peft_type": "IA3"}, r"peft_type='IA3' is not supported; the kit merges LoRA"),
    ({"r": 0}, r"r=0 is not supported; it must be a positive number"),
    ({"r": 3}, r"'model.layers.0.mlp.down_proj' has lora_A \(4, 38\) and lora_B \(16, 4\), not rank 3"),
])
def test_lora_variants_that_are_not_a_low_rank_sum_are_refused_naming_the_field(tmp_path, config, refused):
    _adapter(_llama(tmp_path / "base"), tmp_path / "adapter")
    _edit(tmp_path / "adapter", **config)
    with pytest.raises(tk.CheckpointError, match=refused):
        tk.from_hf(tmp_path / "base", adapter=tmp_path / "adapter")


def test_adapted_embeddings_and_adapters_of_other_models_are_refused(tmp_path):
    base = _llama(tmp_path / "base")
    _adapter(base, tmp_path / "embedding", target_modules=["embed_tokens", "q_proj"])
    with pytest.raises(tk.CheckpointError, match=r"holds '.*embed_tokens.lora_embedding_A', an adapted "
                       r"embedding; the kit merges lora_A and lora_B of linear layers only"):
        tk.from_hf(tmp_path / "base", adapter=tmp_path / "embedding")
    _adapter(_llama(tmp_path / "base"), tmp_path / "adapter")
    tensors = load_file(tmp_path / "adapter" / "adapter_model.safetensors")
    renamed = {k.replace("layers.1.", "layers.7."): v for k, v in tensors.items()}
    save_file(renamed, tmp_path / "adapter" / "adapter_model.safetensors")
    with pytest.raises(tk.CheckpointError, match=r"adapts 'model.layers.7.mlp.down_proj', but the "
                       r"base checkpoint has no 'model.layers.7.mlp.down_proj.weight'.*an adapter for "
                       r"another model"):
        tk.from_hf(tmp_path / "base", adapter=tmp_path / "adapter")
    wide = {k: torch.cat([v, v], dim=1) if "q_proj.lora_A" in k else v for k, v in tensors.items()}
    save_file(wide, tmp_path / "adapter" / "adapter_model.safetensors")
    with pytest.raises(tk.CheckpointError, match=r"adapts 'model.layers.0.self_attn.q_proj' as a \(16, 32\) "
                       r"weight \(fan_in_fan_out=False\); the base checkpoint's is \(16, 16\)"):
        tk.from_hf(tmp_path / "base", adapter=tmp_path / "adapter")
    (tmp_path / "adapter" / "adapter_model.safetensors").unlink()
    with pytest.raises(tk.CheckpointError,
                       match=r"is not a PEFT adapter folder: adapter_model.safetensors is missing"):
        tk.from_hf(tmp_path / "base", adapter=tmp_path / "adapter")
    with pytest.raises(tk.CheckpointError, match=r"'.*nowhere' does not exist; give a PEFT adapter folder"):
        tk.from_hf(tmp_path / "base", adapter=tmp_path / "nowhere")


def test_an_adapted_weight_the_model_does_not_read_is_refused(tmp_path):
    base = _llama(tmp_path / "base")
    _adapter(base, tmp_path / "adapter", target_modules=["q_proj", "lm_head"])
    with pytest.raises(tk.CheckpointError, match=r"holds 'base_model.model.lm_head.base_layer.weight', "
                       r"a base layer's own weights \(PEFT's save_embedding_layers"):
        tk.from_hf(tmp_path / "base", adapter=tmp_path / "adapter")
    _adapter(_llama(tmp_path / "base"), tmp_path / "adapter", target_modules=["q_proj", "lm_head"],
             save_embedding_layers=False)
    config = json.loads((tmp_path / "base" / "config.json").read_text())
    config["tie_word_embeddings"] = True  # the head is the embedding's: lm_head.weight is not read
    (tmp_path / "base" / "config.json").write_text(json.dumps(config))
    with pytest.raises(tk.CheckpointError, match=r"adapts \['lm_head'\], whose weights the kit's model "
                       r"of this checkpoint does not read \(a tied or unused weight\)"):
        tk.from_hf(tmp_path / "base", adapter=tmp_path / "adapter")


@pytest.fixture(scope="module")
def two_adapters(tmp_path_factory):
    """An export of a random Llama with two PEFT adapters kept apart, and PEFT's logits and
    greedy tokens (8) of ``_ids()`` for the base (None) and each adapter, by name."""
    tmp_path = tmp_path_factory.mktemp("two_adapters")
    base = _llama(tmp_path / "base")
    expected = {}

    def outputs(model):  # PEFT's (or the base's) logits and greedy tokens
        with torch.no_grad():
            logits = model(input_ids=_ids()).logits
        return logits, model.generate(input_ids=_ids(), max_new_tokens=8, do_sample=False)[:, 7:]

    expected[None] = outputs(base)
    expected["first"] = outputs(first := _adapter(base, tmp_path / "first"))
    base = first.unload()  # the base again, without the first adapter
    expected["second"] = outputs(_adapter(base, tmp_path / "second", seed=5, r=2,
                                          target_modules=["q_proj", "k_proj", "up_proj"]))
    model = tk.from_hf(tmp_path / "base",
                       adapters={"first": tmp_path / "first", "second": tmp_path / "second"})
    export_onnx(model, tmp_path / "onnx")
    return model, tmp_path / "onnx", expected


def test_adapters_kept_apart_are_bound_per_call_and_equal_peft(two_adapters, tmp_path):
    model, folder, expected = two_adapters
    ids = _ids()
    om = OnnxModel(folder)
    (base_logits, base_tokens), (first_logits, first_tokens), (second_logits, second_tokens) = (
        expected[None], expected["first"], expected["second"])
    assert om.adapters == ["first", "second"]
    for adapter, logits, tokens in ((None, base_logits, base_tokens), ("first", first_logits, first_tokens),
                                    ("second", second_logits, second_tokens)):
        assert relative_error(om(ids.numpy(), adapter=adapter), logits.numpy()) <= 1e-4, adapter
        np.testing.assert_array_equal(om.generate(ids.numpy(), 8, adapter=adapter), tokens.numpy())
    assert not np.array_equal(first_tokens, second_tokens) and not np.array_equal(first_tokens, base_tokens)
    with pytest.raises(tk.InputError, match=r"adapter='third' is not exported in .*; it has 'first', "
                       r"'second'"):
        om.generate(ids.numpy(), 8, adapter="third")
    with pytest.raises(tk.ExportError, match=r"exports in float32 without quantize or optimize; merge"):
        export_onnx(model, tmp_path / "int4", quantize="int4")


def test_engines_per_adapter_batch_their_rows_and_equal_peft_concurrently(two_adapters):
    from transformer_kit.runtime import Engine

    _, folder, expected = two_adapters
    om = OnnxModel(folder)
    ids = _ids().numpy()
    engines = {name: Engine(om, max_batch=4, adapter=name) for name in (None, "first", "second")}
    try:
        requests = [(name, i, engines[name].submit(ids[i], max_new_tokens=8))
                    for i in range(len(ids)) for name in engines]  # all queued before any ends
        for name, i, request in requests:
            assert request.wait(60), (name, i)
            tokens = expected[name][1][i].tolist()
            ended = tokens[:tokens.index(2) + 1] if 2 in tokens else tokens  # eos 2, then padding
            assert request.result() == ended, (name, i)
        assert engines["first"].stats.steps < 8 * len(ids)  # its rows decoded in one batch
    finally:
        for engine in engines.values():
            engine.close()
    with pytest.raises(tk.InputError, match=r"adapter='third' is not exported"):
        Engine(om, adapter="third")
