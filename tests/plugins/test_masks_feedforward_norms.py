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


def test_clamped_swiglu_formula():
    """gpt-oss's experts: g = min(gate, limit), u = clamp(up, -limit, limit),
    down(g * sigmoid(alpha * g) * (u + up_offset)), with biases, written out."""
    torch.manual_seed(0)
    ff = _create("feedforward", "swiglu", bias=True, alpha=1.702, limit=2.0, up_offset=1.0)
    x = 3 * torch.randn(2, 5, 8)
    gate, up = x @ ff.gate.weight.T + ff.gate.bias, x @ ff.up.weight.T + ff.up.bias
    assert (gate > 2.0).any() and (up.abs() > 2.0).any()  # the clamp acts
    g, u = torch.minimum(gate, torch.tensor(2.0)), torch.clamp(up, -2.0, 2.0)
    expected = (g * torch.sigmoid(1.702 * g) * (u + 1.0)) @ ff.down.weight.T + ff.down.bias
    torch.testing.assert_close(ff(x), expected)
    plain = _create("feedforward", "swiglu", limit=None)
    assert ff.clamped and not plain.clamped


@pytest.mark.parametrize(("params", "message"), [
    ({"limit": 0.0}, r"limit must be positive"),
    ({"alpha": "1.7"}, r"alpha must be a finite number, got '1.7'"),
    ({"up_offset": float("inf")}, r"up_offset must be a finite number"),
], ids=str)
def test_clamped_swiglu_options_are_validated(params, message):
    with pytest.raises(tk.ConfigError, match=message):
        _create("feedforward", "swiglu", **params)


def test_layernorm_and_rmsnorm_formulas():
    x = torch.randn(2, 3, 8) * 3 + 1
    ln = _create("norm", "layernorm", eps=1e-5)
    torch.testing.assert_close(ln(x), (x - x.mean(-1, keepdim=True))
                               / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + 1e-5))
    rms = _create("norm", "rmsnorm", eps=1e-6)
    torch.testing.assert_close(rms(x), x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
    with pytest.raises(tk.ConfigError, match=r"eps"):
        _create("norm", "rmsnorm", eps=0)


def test_geglu_formula():
    ff = _create("feedforward", "geglu")
    x = torch.randn(2, 3, 8)
    gate = x @ ff.gate.weight.T
    expected = (torch.nn.functional.gelu(gate, approximate="tanh") * (x @ ff.up.weight.T)) @ ff.down.weight.T
    torch.testing.assert_close(ff(x), expected)
    with pytest.raises(tk.ConfigError, match=r"approximate"):
        _create("feedforward", "geglu", approximate="erf")


def test_parallel_block_adds_both_sub_layers_of_the_input():
    """x + attention(norm1(x)) + feed-forward(norm2(x)): both read the block's input."""
    registry = tk.get_registry()
    ff = torch.nn.Linear(8, 8)
    norms = iter([torch.nn.LayerNorm(8), torch.nn.LayerNorm(8)])
    block = registry.create("block", "parallel", context={"d_model": 8, "dropout": 0.0},
                            self_attention=lambda x, inputs: 2 * x, cross_attention=None,
                            feedforward=ff, make_norm=lambda: next(norms))
    x = torch.randn(2, 3, 8)
    expected = x + 2 * block.self_norm(x) + ff(block.ff_norm(x))
    torch.testing.assert_close(block(x, None), expected)
    assert block.needs_final_norm


def test_post_sublayer_norm_block_norms_each_sub_layer_s_output():
    """x + norm1(attention(x)), then h + norm2(feed-forward(h)) (OLMo2), with a final norm."""
    registry = tk.get_registry()
    ff = torch.nn.Linear(8, 8)
    norms = iter([torch.nn.LayerNorm(8), torch.nn.LayerNorm(8)])
    block = registry.create("block", "post_sublayer_norm", context={"d_model": 8, "dropout": 0.0},
                            self_attention=lambda x, inputs: 2 * x, cross_attention=None,
                            feedforward=ff, make_norm=lambda: next(norms))
    x = torch.randn(2, 3, 8)
    h = x + block.self_norm(2 * x)
    torch.testing.assert_close(block(x, None), h + block.ff_norm(ff(h)))
    assert block.needs_final_norm


def _rms(x, weight, eps=1e-6):
    return weight * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def test_qk_norms_per_head_and_over_the_whole_projection():
    context = {"d_model": 8, "head_dim": 3, "num_heads": 4, "num_kv_heads": 2}
    q, k = torch.randn(2, 5, 12) * 3, torch.randn(2, 5, 6) + 1
    per_head = tk.get_registry().create("qk_norm", "per_head_rmsnorm", context=context)
    whole = tk.get_registry().create("qk_norm", "rmsnorm", context=context, eps=1e-5)
    for norm in (per_head, whole):
        for param in norm.parameters():
            param.data.uniform_(0.5, 1.5)
    assert per_head.q_norm.weight.shape == per_head.k_norm.weight.shape == (3,)
    q_out, k_out = per_head(q, k)
    torch.testing.assert_close(q_out, _rms(q.view(2, 5, 4, 3), per_head.q_norm.weight).view(2, 5, 12))
    torch.testing.assert_close(k_out, _rms(k.view(2, 5, 2, 3), per_head.k_norm.weight).view(2, 5, 6))
    assert (whole.q_norm.weight.shape, whole.k_norm.weight.shape) == ((12,), (6,))
    q_out, k_out = whole(q, k)
    torch.testing.assert_close(q_out, _rms(q, whole.q_norm.weight, 1e-5))
    torch.testing.assert_close(k_out, _rms(k, whole.k_norm.weight, 1e-5))
    with pytest.raises(tk.ConfigError, match=r"eps"):
        tk.get_registry().create("qk_norm", "rmsnorm", context=context, eps=-1.0)
