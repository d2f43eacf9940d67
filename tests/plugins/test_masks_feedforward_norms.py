"""Mask, feed-forward and norm components against torch and their formulas."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import transformer_kit as tk


def _create(kind, name, **params):
    context = {"d_model": 8, "d_ff": 16, "dropout": 0.0}
    return tk.get_registry().create(kind, name, context=context, **params)


def test_causal_mask_is_tril():
    positions = torch.arange(5)[None]
    mask = _create("mask", "causal")(positions, positions)
    assert mask.shape == (1, 1, 5, 5)
    assert torch.equal(mask[0, 0], torch.ones(5, 5, dtype=torch.bool).tril())


def test_sliding_window_mask():
    positions = torch.arange(5)[None]
    mask = _create("mask", "sliding_window", window=2)(positions, positions)[0, 0]
    expected = torch.ones(5, 5, dtype=torch.bool).tril() & ~torch.ones(5, 5, dtype=torch.bool).tril(-2)
    assert torch.equal(mask, expected)
    with pytest.raises(tk.ConfigError, match=r"window"):
        _create("mask", "sliding_window", window=0)


def test_no_mask():
    assert _create("mask", "none")(torch.arange(3)[None], torch.arange(3)[None]) is None


@pytest.mark.parametrize(("name", "activation"), [
    ("relu", F.relu), ("gelu", F.gelu), ("silu", F.silu),
])
def test_two_layer_feedforward(name, activation):
    ff = _create("feedforward", name)
    x = torch.randn(2, 3, 8)
    expected = ff.linear2(activation(ff.linear1(x)))
    torch.testing.assert_close(ff(x), expected)


def test_gelu_tanh_approximation():
    ff = _create("feedforward", "gelu", approximate="tanh")
    x = torch.randn(2, 3, 8)
    h = ff.linear1(x)
    tanh_gelu = 0.5 * h * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (h + 0.044715 * h**3)))
    torch.testing.assert_close(ff(x), ff.linear2(tanh_gelu))


def test_swiglu_formula():
    ff = _create("feedforward", "swiglu")
    x = torch.randn(2, 3, 8)
    gate = x @ ff.gate.weight.T
    expected = (gate * torch.sigmoid(gate) * (x @ ff.up.weight.T)) @ ff.down.weight.T
    torch.testing.assert_close(ff(x), expected)
    assert ff.gate.bias is None


def test_layernorm_and_rmsnorm_formulas():
    x = torch.randn(2, 3, 8) * 3 + 1
    ln = _create("norm", "layernorm", eps=1e-5)
    torch.testing.assert_close(ln(x), (x - x.mean(-1, keepdim=True))
                               / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + 1e-5))
    rms = _create("norm", "rmsnorm", eps=1e-6)
    torch.testing.assert_close(rms(x), x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
    with pytest.raises(tk.ConfigError, match=r"eps"):
        _create("norm", "rmsnorm", eps=0)
