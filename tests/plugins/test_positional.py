"""Positional encodings against their formulas and the properties they exist for."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import transformer_kit as tk


def _create(name, **context):
    return tk.get_registry().create("positional", name, context=context)


def _seed_002_table(length: int, d_model: int) -> np.ndarray:
    """Seed 002's construction in float64: sin on even features, cos on odd, base 10000."""
    position = np.arange(length)[:, None]
    i = np.arange(d_model)[None, :]
    angles = position / np.power(10000, (2 * (i // 2)) / d_model)
    table = np.zeros((length, d_model))
    table[:, 0::2] = np.sin(angles[:, 0::2])
    table[:, 1::2] = np.cos(angles[:, 1::2])
    return table


def test_sinusoidal_matches_the_paper_for_the_seed_heat_map():
    enc = _create("sinusoidal", d_model=128)
    table = enc.table(torch.arange(50)[None])[0]
    assert table.shape == (50, 128)
    np.testing.assert_allclose(table.numpy(), _seed_002_table(50, 128), rtol=0, atol=1e-5)
    assert table[1, 0].item() == pytest.approx(math.sin(1.0), abs=1e-6)
    assert table[1, 1].item() == pytest.approx(math.cos(1.0), abs=1e-6)
    assert table[0, 0::2].abs().max() == 0 and (table[0, 1::2] == 1).all()


def test_sinusoidal_has_no_length_limit_and_adds_to_embeddings():
    enc = _create("sinusoidal", d_model=8)
    positions = torch.tensor([[0, 5000, 100000]])
    x = torch.zeros(1, 3, 8)
    out = enc.embed(x, positions)
    expected = _seed_002_table(100001, 8)[[0, 5000, 100000]]
    np.testing.assert_allclose(out[0].numpy(), expected, rtol=0, atol=1e-2)  # float32 angles
    assert enc.max_positions is None


def test_sinusoidal_split_layout_is_marians():
    """Marian: features j < d/2 hold sin(pos / 10000^(2j/d)), features d/2 + j the cosines."""
    enc = _create("sinusoidal", d_model=6, layout="split")
    table = enc.table(torch.arange(7)[None])[0].double().numpy()
    position_enc = np.array([[pos / np.power(10000, 2 * (j // 2) / 6) for j in range(6)]
                             for pos in range(7)])
    expected = np.concatenate([np.sin(position_enc[:, 0::2]), np.cos(position_enc[:, 1::2])], 1)
    np.testing.assert_allclose(table, expected, rtol=0, atol=1e-6)
    with pytest.raises(tk.ConfigError, match="layout"):
        _create("sinusoidal", d_model=6, layout="zigzag")


def test_learned_token_type_row_zero_is_added():
    enc = _create("learned", d_model=4, max_len=5, token_types=2)
    x = torch.zeros(1, 3, 4)
    expected = enc.table.weight[:3] + enc.token_type.weight[0]
    torch.testing.assert_close(enc.embed(x, torch.arange(3)[None])[0], expected)


def test_learned_positions_are_bounded_by_max_len():
    enc = _create("learned", d_model=4, max_len=3)
    x = torch.zeros(1, 3, 4)
    torch.testing.assert_close(enc.embed(x, torch.arange(3)[None]), enc.table.weight[None])
    with pytest.raises(tk.InputError, match=r"max_len=3"):
        enc.embed(torch.zeros(1, 4, 4), torch.arange(4)[None])


def _rotate_by_complex(x: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
    """Reference: pair feature j with j + d/2 as a complex number, multiply by e^(i pos theta_j)."""
    half = x.shape[-1] // 2
    theta = base ** (-torch.arange(half, dtype=torch.float64) * 2 / x.shape[-1])
    z = torch.complex(x[..., :half].double(), x[..., half:].double())
    rotated = z * torch.polar(torch.ones_like(theta), positions[..., None].double() * theta)
    return torch.cat([rotated.real, rotated.imag], dim=-1)


def test_rotary_matches_complex_rotation():
    enc = _create("rotary", head_dim=8)
    x = torch.randn(2, 3, 5, 8)
    positions = torch.tensor([[0, 1, 2, 3, 4], [7, 9, 11, 13, 200]])
    out = enc.rotate(x, positions)
    expected = _rotate_by_complex(x, positions[:, None, :], 10000.0)
    torch.testing.assert_close(out.double(), expected, rtol=0, atol=1e-4)


def test_rotary_scores_depend_only_on_relative_position():
    enc = _create("rotary", head_dim=16)
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)

    def score(m, n):
        return (enc.rotate(q, torch.tensor([[m]])) * enc.rotate(k, torch.tensor([[n]]))).sum()

    assert score(3, 1) == pytest.approx(score(103, 101).item(), abs=1e-4)
    assert score(3, 1) != pytest.approx(score(3, 2).item(), abs=1e-3)


def test_rotary_partial_and_invalid_dims():
    enc = _create("rotary", head_dim=8, rotary_dim=4)
    x = torch.randn(1, 1, 3, 8)
    out = enc.rotate(x, torch.tensor([[1, 2, 3]]))
    torch.testing.assert_close(out[..., 4:], x[..., 4:])
    with pytest.raises(tk.ConfigError, match=r"even rotary_dim"):
        _create("rotary", head_dim=5)


def test_alibi_slopes_and_bias():
    enc = _create("alibi", num_heads=8)
    torch.testing.assert_close(enc.slopes, torch.tensor([2.0 ** -(i + 1) for i in range(8)]))
    bias = enc.score_bias(torch.tensor([[2]]), torch.tensor([[0, 1, 2]]))
    assert bias.shape == (1, 8, 1, 3)
    torch.testing.assert_close(bias[0, 0, 0], torch.tensor([-1.0, -0.5, 0.0]))
    odd = _create("alibi", num_heads=6).slopes  # not a power of two: the paper's interleaving
    expected = [2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8, 2 ** -1, 2 ** -3]
    torch.testing.assert_close(odd, torch.tensor(expected))


def test_none_changes_nothing():
    enc = _create("none")
    x = torch.randn(1, 2, 4)
    assert torch.equal(enc.embed(x, torch.arange(2)[None]), x)
    assert enc.score_bias(torch.zeros(1, 2), torch.zeros(1, 2)) is None


def test_learned_offset_reads_rows_after_the_offset():
    enc = _create("learned", d_model=4, max_len=3, offset=2)
    assert enc.table.weight.shape == (5, 4)
    embedded = enc.embed(torch.zeros(1, 3, 4), torch.arange(3)[None])[0]
    torch.testing.assert_close(embedded, enc.table.weight[2:])
    with pytest.raises(tk.InputError, match=r"max_len=3"):
        enc.embed(torch.zeros(1, 4, 4), torch.arange(4)[None])


@pytest.mark.parametrize(("causal", "buckets", "distance"), [(False, 32, 128), (True, 32, 128), (False, 8, 6),
                                                              (True, 6, 5)])
def test_relative_bias_buckets_are_t5_s(causal, buckets, distance):
    """Every distance from -300 to 300 falls in the bucket transformers' T5 puts it in."""
    from transformers.models.t5.modeling_t5 import T5Attention

    enc = _create("relative_bias", num_heads=2, causal=causal, num_buckets=buckets, max_distance=distance)
    relative = torch.arange(-300, 301)[None, :]
    expected = T5Attention._relative_position_bucket(relative, bidirectional=not causal,
                                                     num_buckets=buckets, max_distance=distance)
    torch.testing.assert_close(enc.buckets(relative), expected, rtol=0, atol=0)
    q, k = torch.tensor([[0, 1, 2]]), torch.tensor([[0, 1, 2, 3]])
    bias = enc.score_bias(q, k)  # (1, heads, 3, 4): the table's row of each pair's bucket, per head
    assert bias.shape == (1, 2, 3, 4)
    torch.testing.assert_close(bias[0, :, 2, 0], enc.table.weight[int(enc.buckets(torch.tensor(-2)))])
    with pytest.raises(tk.ConfigError, match=r"num_buckets"):
        _create("relative_bias", num_heads=2, causal=causal, num_buckets=1)
