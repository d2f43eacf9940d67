"""The phi3 family: Phi3ForCausalLM checkpoints (fused qkv and gate/up projections, partial
rotary, LongRoPE, sliding windows) equal transformers in PyTorch and onnxruntime, also past the
original length where LongRoPE's long factors turn."""

from __future__ import annotations

import json
from typing import ClassVar

import numpy as np
import pytest
import torch
import transformers as hf

import transformer_kit as tk
from tests.plugins.families import parity
from transformer_kit.export import export_onnx
from transformer_kit.export.verify import relative_error
from transformer_kit.runtime import OnnxModel


def _phi3(hidden, heads, kv_heads, layers, original=32, **extra):
    model = parity.random_norms(hf.Phi3ForCausalLM(hf.Phi3Config(
        vocab_size=parity.VOCAB, hidden_size=hidden, intermediate_size=2 * hidden + 6,
        num_attention_heads=heads, num_key_value_heads=kv_heads, num_hidden_layers=layers,
        max_position_embeddings=64, original_max_position_embeddings=original, bos_token_id=1,
        eos_token_id=2, pad_token_id=None, **extra)))
    with torch.no_grad():  # scores of some spread, so that rotary (and its factors) shows
        for layer in model.model.layers:
            layer.self_attn.qkv_proj.weight.mul_(8.0)
    return model


def _longrope(pairs: int, **extra) -> dict:
    """rope_parameters of type longrope with ``pairs`` short and long factors."""
    return {"rope_type": "longrope", "rope_theta": 10000.0, **extra,
            "short_factor": [1.0 + 0.3 * i for i in range(pairs)],
            "long_factor": [1.0 + 2.5 * i for i in range(pairs)]}


def _phi4_mini(original=32):
    """Phi-4-mini's shape: 3 / 4 of each head rotates, tied embeddings, grouped KV heads."""
    return _phi3(32, 4, 2, 2, original=original, tie_word_embeddings=True,
                 rope_parameters=_longrope(3, partial_rotary_factor=0.75))


class TestPhi3(parity.FamilyParity):
    # the generations (6 + 12 positions) stay within the original length: past it, transformers'
    # Phi-3 recomputes its cache with the long factors, which the kit's cache does not (see
    # test_past_the_original_length below for prompts that start past it)
    CHECKPOINTS: ClassVar = {
        "phi3-4heads-kv4-2layers-longrope-window5": lambda: _phi3(
            32, 4, 4, 2, sliding_window=5, rope_parameters=_longrope(4)),
        "phi4-mini-4heads-kv2-2layers-partial-rotary-tied": _phi4_mini,
        "phi3-mini-4k-2heads-1layer-window3": lambda: _phi3(16, 2, 2, 1, sliding_window=3),
    }


@pytest.mark.parametrize("make", [lambda: _phi3(32, 4, 2, 2, original=16, rope_parameters=_longrope(4)),
                                  lambda: _phi4_mini(original=16)], ids=["phi3", "phi4-mini"])
def test_past_the_original_length_the_long_factors_turn_as_in_transformers(make, tmp_path):
    """Prompts of 20 positions, past an original length of 16 (of 64): PyTorch and onnxruntime
    equal transformers (which switches to the long factors for the whole call), and greedy
    tokens continuing them do."""
    reference, model, _ = parity.load("phi3-long", make, tmp_path / "hf")
    ids = torch.randint(3, parity.VOCAB - 2, (2, 20), generator=torch.Generator().manual_seed(5))
    ids[1, 17:] = 0
    mask = (ids != 0).long()
    with torch.no_grad():
        expected = reference(input_ids=ids, attention_mask=mask).logits
        short = reference(input_ids=ids[:, :9], attention_mask=mask[:, :9]).logits
        ours = model(ids, attention_mask=mask)
    real = mask.bool()
    # the long factors changed every position, by more than the tolerance of the comparisons
    assert relative_error(short, expected[:, :9]) > 20 * parity.TOLERANCE
    assert relative_error(ours[real], expected[real]) <= parity.TOLERANCE
    report = export_onnx(model, tmp_path / "onnx")
    om = OnnxModel(tmp_path / "onnx", providers="cpu")
    assert relative_error(om(ids.numpy(), attention_mask=mask.numpy())[real.numpy()],
                          expected[real].numpy()) <= max(parity.TOLERANCE, report.tolerance)
    prompt = ids[:1]
    with torch.no_grad():
        out = reference.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt),
                                 generation_config=hf.GenerationConfig(
                                     do_sample=False, max_new_tokens=8, pad_token_id=0, eos_token_id=None))
    expected_tokens = out[:, 20:].numpy()
    np.testing.assert_array_equal(om.generate(prompt.numpy(), max_new_tokens=8, eos_id=None), expected_tokens)
    np.testing.assert_array_equal(model.generate(prompt, max_new_tokens=8, eos_id=None).numpy(),
                                  expected_tokens)


def test_the_fused_projections_split_into_the_kits(tmp_path):
    reference = _phi3(32, 4, 2, 1, rope_parameters=_longrope(3, partial_rotary_factor=0.75))
    reference.save_pretrained(tmp_path)
    model = tk.from_hf(tmp_path, pad_id=0)
    attention, ff = model.decoder.layers[0].self_attention, model.decoder.layers[0].feedforward
    qkv = reference.model.layers[0].self_attn.qkv_proj.weight
    assert torch.equal(torch.cat([attention.q_proj.weight, attention.k_proj.weight,
                                  attention.v_proj.weight]), qkv)
    assert attention.k_proj.weight.shape == (16, 32)  # 2 KV heads of 8
    gate_up = reference.model.layers[0].mlp.gate_up_proj.weight
    assert torch.equal(torch.cat([ff.gate.weight, ff.up.weight]), gate_up)
    assert model.config.positional.params["rotary_dim"] == 6


def _edited(tmp_path, **changes):
    _phi3(16, 2, 2, 1, rope_parameters=_longrope(4)).save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    config = json.loads(path.read_text())
    for key, value in changes.items():
        if key.startswith("rope."):
            config["rope_parameters"][key[5:]] = value
        else:
            config[key] = value
    path.write_text(json.dumps(config))
    return tmp_path


@pytest.mark.parametrize(("changes", "message"), [
    ({"hidden_act": "gelu_new"}, "phi3 checkpoint with hidden_act 'gelu_new'"),
    ({"rope.rope_type": "dynamic", "rope.type": "dynamic"},
     "phi3 checkpoint with rope_parameters of type 'dynamic'"),
    ({"rope.partial_rotary_factor": 0.1}, "phi3 checkpoint with partial_rotary_factor 0.1"),
    ({"rope.partial_rotary_factor": 0.5}, r"phi3 checkpoint with rope_parameters short_factor of 4 "
                                          r"values \(rotary_dim 4 needs 2"),
    ({"sliding_window": 0}, "phi3 checkpoint with sliding_window 0"),
])
def test_unsupported_variants_are_refused_naming_the_field(tmp_path, changes, message):
    with pytest.raises(tk.CheckpointError, match=message):
        tk.config_from_hf(_edited(tmp_path, **changes))


def test_the_first_releases_name_for_longrope_reads_as_longrope(tmp_path):
    longrope = tk.config_from_hf(_edited(tmp_path / "a"), pad_id=0)
    su = tk.config_from_hf(_edited(tmp_path / "b", **{"rope.rope_type": "su", "rope.type": "su"}), pad_id=0)
    assert su == longrope and longrope.positional.params["scaling"]["type"] == "longrope"


def test_a_streamed_checkpoint_exports_the_split_projections(tmp_path):
    """stream=True records the fused projections' slices and reads them when the export writes
    them: the graphs compute what the model loaded in memory computes."""
    _phi4_mini().save_pretrained(tmp_path / "hf")
    streamed = tk.from_hf(tmp_path / "hf", stream=True, pad_id=0)
    report = export_onnx(streamed, tmp_path / "onnx")
    assert report.max_error <= parity.TOLERANCE
    ids, mask = parity.batch(streamed)
    with torch.no_grad():
        expected = tk.from_hf(tmp_path / "hf", pad_id=0)(ids, attention_mask=mask)
    ours = OnnxModel(tmp_path / "onnx", providers="cpu")(ids.numpy(), attention_mask=mask.numpy())
    assert relative_error(ours[mask.bool().numpy()], expected[mask.bool()].numpy()) <= parity.TOLERANCE
