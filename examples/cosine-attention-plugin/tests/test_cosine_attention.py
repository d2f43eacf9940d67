"""The plugin's own tests: the formula, masks, and a model built by name."""

from __future__ import annotations

import torch
from tk_cosine_attention import CosineAttention

import transformer_kit as tk


def test_matches_the_formula_with_a_mask():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, 4, 8), torch.randn(2, 3, 5, 8), torch.randn(2, 3, 5, 8)
    mask = torch.ones(2, 1, 1, 5, dtype=torch.bool)
    mask[1, ..., 3:] = False
    kernel = CosineAttention(temperature=5.0)
    cos = torch.nn.functional.cosine_similarity(q[..., :, None, :], k[..., None, :, :], dim=-1)
    scores = (5.0 * cos).masked_fill(~mask, float("-inf"))
    expected = torch.softmax(scores, dim=-1) @ v
    torch.testing.assert_close(kernel(q, k, v, mask=mask), expected, rtol=1e-5, atol=1e-6)


def test_a_row_with_no_visible_key_gives_zeros():
    q = k = v = torch.randn(1, 1, 2, 4)
    out = CosineAttention()(q, k, v, mask=torch.zeros(1, 1, 2, 2, dtype=torch.bool))
    assert torch.equal(out, torch.zeros_like(out))


def test_builds_by_name_when_registered():
    import tk_cosine_attention

    registry = tk.get_registry()
    if "cosine" not in registry.names("attention"):  # not installed: register it by hand
        tk.register_plugin(tk_cosine_attention, name="cosine_attention")
    model = tk.build_model({"architecture": "decoder", "vocab_size": 20, "d_model": 16,
                            "num_heads": 2, "num_layers": 1, "d_ff": 32, "dropout": 0.0,
                            "attention": {"name": "cosine", "temperature": 4.0},
                            "positional": "alibi"})
    kernel = model.decoder.layers[0].self_attention.kernel
    assert isinstance(kernel, CosineAttention) and kernel.temperature.item() == 4.0
    ids = torch.tensor([[3, 4, 5]])
    assert torch.equal(model.generate(ids, 4), model.generate(ids, 4, use_cache=False))


def test_exports_with_its_lowering_and_traces_the_norm_without_one(tmp_path):
    import tk_cosine_attention

    from transformer_kit.export import export_onnx
    from transformer_kit.runtime import OnnxModel

    registry = tk.get_registry()
    if "cosine" not in registry.names("attention"):
        tk.register_plugin(tk_cosine_attention, name="cosine_attention")
    torch.manual_seed(0)
    model = tk.build_model({"architecture": "decoder", "vocab_size": 20, "d_model": 16,
                            "num_heads": 4, "num_kv_heads": 2, "num_layers": 2, "d_ff": 32,
                            "dropout": 0.0, "attention": "cosine", "qk_norm": "l2_heads",
                            "positional": "rotary"})
    report = export_onnx(model, tmp_path / "onnx")
    assert report.max_error <= 1e-4 and report.tokens_match
    # the kernel's own lowering wrote it; the norm, which has none, was traced once for both layers
    (traced,) = report.traced_components
    assert traced.startswith("qk_norm 'l2_heads'") and "traced 1 time" in report.traced_components[traced]
    ids = torch.tensor([[3, 4, 5, 6]])
    om = OnnxModel(tmp_path / "onnx", providers="cpu")
    assert torch.equal(torch.from_numpy(om.generate(ids.numpy(), 5)), model.generate(ids, 5))
