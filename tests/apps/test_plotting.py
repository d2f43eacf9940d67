"""The plotting functions: captured attention weights and positional matrices against the
formulas; bad sizes are typed errors."""

from __future__ import annotations

import pytest
import torch

import transformer_kit as tk
from tests.combinations import tiny_config
from transformer_kit.apps.plotting import capture_attention, plot_positional, positional_matrix


def test_attention_capture_matches_the_softmax_weights():
    model = tk.build_model(tiny_config("decoder"))
    with torch.no_grad(), capture_attention(model) as records:
        model(torch.tensor([[5, 6, 7, 0]]))
    assert [name for name, _ in records] == ["decoder.layers.0.self_attention",
                                             "decoder.layers.1.self_attention"]
    weights = records[0][1]
    assert weights.shape == (1, 4, 4, 4)
    torch.testing.assert_close(weights.sum(-1)[0, :, :3], torch.ones(4, 3))
    assert torch.equal(weights[0, :, :, 3], torch.zeros(4, 4))  # the padding key
    assert torch.equal(weights.triu(1), torch.zeros_like(weights))  # causal


def test_the_sinusoidal_matrix_is_the_paper_s():
    matrix, axis = positional_matrix("sinusoidal", 50, 128)
    assert axis == "dimension" and matrix.shape == (50, 128)
    assert matrix[1, 0].item() == pytest.approx(0.841471, abs=1e-5)  # sin(1)
    assert matrix[1, 1].item() == pytest.approx(0.540302, abs=1e-5)  # cos(1)


@pytest.mark.parametrize(("length", "d_model"), [(0, 8), (-5, 8), (4, 0), (4, 1)])
def test_sizes_below_the_minimum_are_input_errors(tmp_path, length, d_model):
    with pytest.raises(tk.InputError, match=r"must be an integer >= "):
        plot_positional(tmp_path / "x.png", "sinusoidal", length, d_model)
    assert not (tmp_path / "x.png").exists()
