"""The pooling components against hand-computed sentence vectors: kept positions only, float32
sums, and rows with nothing kept give zeros (never NaN or -inf)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import transformer_kit as tk
from tests.combinations import POOLINGS

HIDDEN = torch.tensor([[[1.0, -2.0], [3.0, 4.0], [5.0, -6.0]],
                       [[-1.0, 2.0], [7.0, 0.5], [9.0, 9.0]]])  # (2, 3, 2)
KEEP = torch.tensor([[True, True, False], [False, True, True]])


def _pool(name: str, hidden=HIDDEN, real=KEEP) -> torch.Tensor:
    return tk.get_registry().create("pooling", name, context={"d_model": 2})(hidden, real)


@pytest.mark.parametrize("name, expected", [
    ("cls", [[1.0, -2.0], [7.0, 0.5]]),
    ("lasttoken", [[3.0, 4.0], [9.0, 9.0]]),
    ("mean", [[2.0, 1.0], [8.0, 4.75]]),
    ("mean_sqrt_len", [[4.0 / 2**0.5, 2.0 / 2**0.5], [16.0 / 2**0.5, 9.5 / 2**0.5]]),
    ("max", [[3.0, 4.0], [9.0, 9.0]]),
    # weights by position (1, 2, 3): row 0 (1*h0 + 2*h1) / 3, row 1 (2*h1 + 3*h2) / 5
    ("weightedmean", [[7.0 / 3, 6.0 / 3], [41.0 / 5, 28.0 / 5]]),
])
def test_each_pooling_reads_only_kept_positions(name, expected):
    torch.testing.assert_close(_pool(name), torch.tensor(expected), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", POOLINGS)
def test_a_row_with_nothing_kept_is_finite_zeros_or_its_first_token(name):
    real = torch.tensor([[False, False, False], [True, True, True]])
    out = _pool(name, real=real)
    assert torch.isfinite(out).all()
    if name != "cls":  # cls reads the first position of a row whatever its mask
        assert torch.equal(out[0], torch.zeros(2))


@pytest.mark.parametrize("name", POOLINGS)
def test_half_precision_hidden_states_keep_their_dtype(name):
    out = _pool(name, hidden=HIDDEN.half())
    assert out.dtype == torch.float16
    torch.testing.assert_close(out.float(), _pool(name), rtol=2e-3, atol=2e-3)


def test_every_pooling_is_registered():
    assert tk.get_registry().names("pooling") == sorted(POOLINGS)


class _MinPooling(torch.nn.Module):
    """A third party's pooling: the feature-wise minimum over kept positions."""

    def forward(self, hidden, real):
        return hidden.masked_fill(~real[..., None], torch.finfo(hidden.dtype).max).amin(dim=1)


class _MinPlugin:
    @tk.hookimpl
    def transformer_kit_components(self):
        return [tk.Component("pooling", "min", _MinPooling, description="feature-wise minimum")]


def test_a_plugin_s_pooling_builds_exports_and_embeds(fresh_registry, tmp_path):
    from transformer_kit.export import export_onnx
    from transformer_kit.runtime import OnnxModel

    tk.register_plugin(_MinPlugin(), name="min-pooling")
    torch.manual_seed(0)
    model = tk.build_model({"architecture": "encoder", "vocab_size": 30, "d_model": 16, "num_heads": 2,
                            "num_layers": 1, "d_ff": 32, "dropout": 0.0, "pooling": "min",
                            "sentence_embedding": {"normalize": True}}).eval()
    assert model.components["pooling"].plugin == "min-pooling"
    ids = [[3, 4, 5, 6], [7, 8]]
    hidden, real = model.hidden_states(torch.tensor([[3, 4, 5, 6], [7, 8, 0, 0]]))
    expected = torch.nn.functional.normalize(_MinPooling()(hidden, real), dim=-1).detach().numpy()
    export_onnx(model, tmp_path)
    np.testing.assert_allclose(OnnxModel(tmp_path).embed(ids), expected, atol=1e-5)
    np.testing.assert_allclose(model.embed(ids), expected, atol=1e-6)
