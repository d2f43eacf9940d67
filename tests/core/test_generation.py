"""Greedy generation: cached equals uncached for the built-in combinations; stopping at eos."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

import transformer_kit as tk
from tests.combinations import all_generating_configs, tiny_config

CASES = all_generating_configs()


def _prompts(architecture: str) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 37, (3, 6), generator=gen)
    if architecture == "decoder":
        ids[1, 4:] = 0  # right padding
        ids[2, :3] = 0  # left padding
    else:
        ids[1, 3:] = 0
    return ids


@pytest.mark.parametrize("config", [c for _, c in CASES], ids=[i for i, _ in CASES])
def test_cached_generation_equals_uncached(config):
    torch.manual_seed(0)
    model = tk.build_model(config)
    ids = _prompts(config["architecture"])
    cached = model.generate(ids, max_new_tokens=8)
    uncached = model.generate(ids, max_new_tokens=8, use_cache=False)
    assert cached.shape[0] == 3 and 1 <= cached.shape[1] <= 8
    assert torch.equal(cached, uncached)


def _model_with(config: dict, source: tk.build_model, **changes):
    model = tk.build_model({**config, **changes})
    model.load_state_dict(source.state_dict())
    return model


@pytest.mark.parametrize("architecture", ["decoder", "encoder_decoder"])
def test_rows_stop_at_eos_and_are_filled(architecture):
    torch.manual_seed(0)
    config = tiny_config(architecture)
    model = tk.build_model(config)
    ids = _prompts(architecture)
    free = model.generate(ids, max_new_tokens=10)
    eos = int(free[0, 2])  # make the third token of row 0 the end of sequence
    stopping = _model_with(config, model, eos_id=eos)
    out = stopping.generate(ids, max_new_tokens=10)
    for row in range(3):
        hits = (free[row] == eos).nonzero().flatten()
        end = int(hits[0]) + 1 if len(hits) else free.shape[1]
        assert torch.equal(out[row, :end], free[row, :end])
        assert (out[row, end:] == config.get("pad_id", 0)).all()
    if all((free[r] == eos).any() for r in range(3)):
        assert out.shape[1] < 10  # everyone stopped early


def test_padding_side_and_batching_do_not_change_tokens():
    torch.manual_seed(0)
    model = tk.build_model(tiny_config("decoder", positional="rotary", attention="sdpa"))
    prompts = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14]]
    alone = [model.generate(torch.tensor([p]), max_new_tokens=6)[0] for p in prompts]
    right = torch.tensor([p + [0] * (5 - len(p)) for p in prompts])
    left = torch.tensor([[0] * (5 - len(p)) + p for p in prompts])
    for batch in (right, left):
        out = model.generate(batch, max_new_tokens=6)
        for row, expected in enumerate(alone):
            assert torch.equal(out[row, : len(expected)], expected)
            assert (out[row, len(expected):] == 0).all()


def test_generate_restores_training_mode_and_uses_no_dropout():
    torch.manual_seed(0)
    model = tk.build_model(tiny_config("decoder", dropout=0.5)).train()
    ids = torch.tensor([[4, 5, 6]])
    first = model.generate(ids, max_new_tokens=5)
    assert model.training
    assert torch.equal(first, model.generate(ids, max_new_tokens=5))


def test_generation_arguments_are_checked():
    model = tk.build_model(tiny_config("decoder", positional="learned", max_len=8))
    with pytest.raises(tk.InputError, match=r"max_new_tokens"):
        model.generate(torch.tensor([[4, 5]]), max_new_tokens=-1)
    with pytest.raises(tk.InputError, match=r"context length is 8; .* at most 5"):
        model.generate(torch.tensor([[4, 5, 6]]), max_new_tokens=6)
    with pytest.raises(tk.InputError, match=r"only padding"):
        model.generate(torch.tensor([[4, 5], [0, 0]]), max_new_tokens=2)
    assert model.generate(torch.tensor([[4, 5]]), max_new_tokens=0).shape == (1, 0)
    encoder = tk.build_model(tiny_config("encoder"))
    with pytest.raises(tk.InputError, match=r"needs a decoder"):
        encoder.generate(torch.tensor([[4, 5]]))


def _step_flops(model, past_len: int, use_cache: bool) -> int:
    """Counted floating-point operations of one decoding step after ``past_len`` tokens."""
    from torch.utils.flop_counter import FlopCounterMode

    ids = torch.randint(3, 37, (1, past_len + 1))
    real = torch.ones(1, past_len + 1, dtype=torch.bool)
    caches = None
    if use_cache:
        caches = model.new_cache(1, model.head.weight)
        model.step(ids[:, :-1], real[:, :-1], caches)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model.step(ids[:, -1:] if use_cache else ids, real, caches)
    return counter.get_total_flops()


def test_a_cached_step_costs_linear_work_in_the_length():
    model = tk.build_model(tiny_config("decoder", max_len=1024)).eval()
    cached = [_step_flops(model, n, True) for n in (128, 256, 512)]
    uncached = [_step_flops(model, n, False) for n in (128, 256, 512)]
    # cached: a constant plus attention over the past, a + b * n: doubling n doubles the increment
    growth = [b - a for a, b in itertools.pairwise(cached)]
    assert growth[0] > 0 and growth[1] == 2 * growth[0]
    # uncached: every position again, a * n + b * n^2: the increment more than doubles
    growth = [b - a for a, b in itertools.pairwise(uncached)]
    assert growth[1] > 3 * growth[0]
    assert cached[2] * 40 < uncached[0]


def test_null_special_ids_generate_without_stopping_or_refuse_with_a_sentence(tmp_path):
    from transformer_kit.export import export_onnx
    from transformer_kit.runtime import OnnxModel

    torch.manual_seed(0)
    decoder = tk.build_model(tiny_config("decoder", eos_id=None, bos_id=None, pad_id=None)).eval()
    ids = torch.tensor([[3, 4, 5]])
    tokens = decoder.generate(ids, 7)
    assert tokens.shape == (1, 7)  # no eos: runs to max_new_tokens
    export_onnx(decoder, tmp_path / "decoder")
    np.testing.assert_array_equal(OnnxModel(tmp_path / "decoder").generate(ids.numpy(), 7), tokens.numpy())
    seq2seq = tk.build_model(tiny_config("encoder_decoder", bos_id=None)).eval()
    with pytest.raises(tk.ConfigError, match=r"bos_id is null, but encoder_decoder decoding starts"):
        seq2seq.generate(ids, 3)
    export_onnx(seq2seq, tmp_path / "seq2seq")
    with pytest.raises(tk.ConfigError, match=r"bos_id is null"):
        OnnxModel(tmp_path / "seq2seq").generate(ids.numpy(), 3)
