"""The benchmark helpers: accounting checked against transformers' own parameter counts and
torch's FLOP counter, the runners against each other token for token. No timing is asserted."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import transformer_kit as tk
from testbed import peers
from transformer_kit.apps import benchmark as b
from transformer_kit.apps.commands.bench import hf_generation_runners, load_optimum_causal_lm
from transformer_kit.export import export_onnx
from transformer_kit.runtime import OnnxModel


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bench") / "gpt2"
    peers.gpt2_checkpoint(folder, vocab=97, d_model=32, layers=2, heads=4)
    return folder


def test_weight_bytes_per_token_counts_every_weight_but_the_embedding_tables(gpt2):
    import transformers

    hf = transformers.GPT2LMHeadModel.from_pretrained(gpt2)
    # tied head: the token table is read in full once (as the head), the position table not at all
    expected = 4 * (hf.num_parameters() - hf.transformer.wpe.weight.numel())
    assert b.weight_bytes_per_token(tk.from_hf(gpt2)) == expected


def test_weight_bytes_per_token_counts_an_untied_head_and_half_precision():
    model = tk.build_model({"architecture": "decoder", "vocab_size": 50, "d_model": 16, "num_heads": 2,
                            "num_layers": 1, "d_ff": 32, "tie_embeddings": False})
    layer = sum(p.numel() for p in model.decoder.parameters())
    assert model.head.bias is None
    assert b.weight_bytes_per_token(model) == 4 * (layer + 50 * 16)  # the head's own weight
    assert b.weight_bytes_per_token(model.half()) == 2 * (layer + 50 * 16)


def test_forward_flops_equal_the_matrix_products_of_a_one_layer_decoder():
    d, ff, vocab, n = 16, 32, 50, 5
    model = tk.build_model({"architecture": "decoder", "vocab_size": vocab, "d_model": d, "num_heads": 2,
                            "num_layers": 1, "d_ff": ff, "attention": "matmul"})
    projections = 4 * d * d + 2 * d * ff + d * vocab  # q, k, v, o; two feed-forward; head
    attention = 2 * n * d  # q k^T and weights @ v, per query
    assert b.forward_flops(model, torch.ones(1, n, dtype=torch.long)) == 2 * n * (projections + attention)


def test_interleaved_calls_each_runner_once_per_round_after_a_warm_up():
    calls = {"a": 0, "b": 0}

    def runner(name, tokens):
        def run():
            calls[name] += 1
            return np.zeros(tokens)
        return b.Runner(name, run, lambda out: out.size)

    probe_calls = []
    timings, probes = b.interleaved([runner("a", 3), runner("b", 5)], 4,
                                    {"p": lambda: probe_calls.append(1) or 2.0})
    assert calls == {"a": 5, "b": 5} and probes == {"p": [2.0] * 4}
    assert [t.tokens for t in timings] == [3, 5] and all(len(t.seconds) == 4 for t in timings)


def test_the_order_of_runners_rotates_from_round_to_round():
    order = []
    runners = [b.Runner(name, lambda name=name: order.append(name)) for name in "abc"]
    b.interleaved(runners, 3)
    assert order == [*"abc", *"abc", *"bca", *"cab"]  # warm-ups, then one rotation a round


def test_settled_rounds_call_each_runner_twice_and_time_the_second():
    calls = []
    runner = b.Runner("a", lambda: calls.append(len(calls)) or len(calls))
    timings, _ = b.interleaved([runner], 3, settle=True)
    assert len(calls) == 1 + 2 * 3 and len(timings[0].seconds) == 3


def test_ratio_is_the_median_of_ratios_within_rounds():
    base = b.Timing("base", [1.0, 2.0, 4.0])
    other = b.Timing("other", [0.5, 0.5, 4.0])
    assert b.ratio_to([base, other], "base", "other") == 2.0  # per round: 2, 4, 1


def test_random_prompts_avoid_special_ids_and_are_reproducible():
    ids = b.random_prompts(10, 64, 32, {0, 1, 9}, seed=3)
    assert ids.shape == (64, 32) and not np.isin(ids.numpy(), [0, 1, 9]).any()
    assert set(np.unique(ids.numpy())) == set(range(2, 9))
    assert torch.equal(ids, b.random_prompts(10, 64, 32, {0, 1, 9}, seed=3))


def test_all_runners_generate_the_same_tokens(gpt2, tmp_path):
    model = tk.from_hf(gpt2, pad_id=0)
    export_onnx(model, tmp_path / "onnx")
    om = OnnxModel(tmp_path / "onnx", "cpu")
    ids = b.random_prompts(97, 1, 6, {0, 1, 96})
    runners = b.kit_generation_runners(model, om, ids, 8)
    runners += hf_generation_runners(gpt2, tmp_path, ids, 8)
    timings, _ = b.interleaved(runners, 1)
    assert [t.tokens for t in timings] == [8] * len(runners)
    reference = np.asarray(timings[0].result)
    for t in timings[1:]:
        assert np.array_equal(np.asarray(t.result), reference), t.name


def test_optimum_runs_the_same_checkpoint_to_the_same_tokens(gpt2, tmp_path):
    pytest.importorskip("optimum.onnxruntime")
    model = tk.from_hf(gpt2, pad_id=0)
    ids = b.random_prompts(97, 1, 6, {0, 1, 96})
    names = [r.name for r in hf_generation_runners(gpt2, tmp_path, ids, 8)]
    assert any(name.startswith("optimum") for name in names)
    optimum = load_optimum_causal_lm(gpt2, tmp_path)
    out = optimum.generate(ids, max_new_tokens=8, min_new_tokens=8, do_sample=False, pad_token_id=0,
                           attention_mask=torch.ones_like(ids))[:, 6:]
    assert torch.equal(out, model.generate(ids, 8))


def test_an_export_is_current_only_for_the_options_it_was_made_with(gpt2, tmp_path):
    from transformer_kit.export import Int4

    folder = tmp_path / "int4"
    assert not b.export_is_current(folder, Int4())  # nothing there yet
    export_onnx(tk.from_hf(gpt2), folder, quantize=Int4(block_size=16, calibration=None), verify=False)
    assert b.export_is_current(folder, Int4(block_size=16, calibration=None))
    assert not b.export_is_current(folder, Int4(block_size=16, calibration=None, symmetric=False))
    assert not b.export_is_current(folder, Int4(block_size=16))  # calibrated
    assert not b.export_is_current(folder, None)  # float32
    export_onnx(tk.from_hf(gpt2), tmp_path / "float32", verify=False)
    assert b.export_is_current(tmp_path / "float32", None)
    assert not b.export_is_current(tmp_path / "float32", None, "float16")  # another precision
    assert not b.export_is_current(tmp_path / "float32", "int8")
    assert not b.export_is_current(tmp_path / "float32", "int4")
