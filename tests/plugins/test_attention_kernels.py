"""The attention kernels against the seeds' worked numbers and against each other."""

from __future__ import annotations

import math

import pytest
import torch

import transformer_kit as tk
from transformer_kit.core.masks import from_padding_convention, padding_mask

KERNELS = ["matmul", "einsum", "sdpa"]

# Seeds 000 and 002: K (4, 3), V (4, 2).
K = torch.tensor([[10, 0, 0], [0, 10, 0], [0, 0, 10], [0, 0, 10]], dtype=torch.float32)
V = torch.tensor([[1, 0], [10, 0], [100, 5], [1000, 6]], dtype=torch.float32)


def _kernel(name: str):
    return tk.get_registry().create("attention", name)


def _attend(name, q, k=K, v=V, mask=None):
    """Seed tensors (len, dim) -> kernel on (1, 1, len, dim) -> (len, v_dim)."""
    out = _kernel(name)(q[None, None], k[None, None], v[None, None], mask=mask)
    return out[0, 0]


@pytest.mark.parametrize("name", KERNELS)
@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ([[0, 10, 0]], [[10.0, 0.0]]),
        ([[0, 0, 10]], [[550.0, 5.5]]),
        ([[0, 0, 10], [0, 10, 0], [10, 10, 0]], [[550.0, 5.5], [10.0, 0.0], [5.5, 0.0]]),
    ],
)
def test_seed_worked_examples(name, query, expected):
    out = _attend(name, torch.tensor(query, dtype=torch.float32))
    torch.testing.assert_close(out, torch.tensor(expected), rtol=0, atol=1e-4)


def test_seed_attention_weights():
    matmul = _kernel("matmul")
    q = torch.tensor([[0, 10, 0], [0, 0, 10], [10, 10, 0]], dtype=torch.float32)
    weights = matmul.weights(q[None, None], K[None, None])[0, 0]
    expected = torch.tensor([[0, 1, 0, 0], [0, 0, 0.5, 0.5], [0.5, 0.5, 0, 0]])
    torch.testing.assert_close(weights, expected, rtol=0, atol=1e-6)


def test_seed_padding_mask():
    ids = torch.tensor([[1, 21, 777, 0, 0]])
    seed = torch.tensor([[[[0, 0, 0, 1, 1]]]])  # seed 002: 1 marks padding
    mask = padding_mask(ids, pad_id=0)
    assert mask.shape == (1, 1, 1, 5)
    assert mask.dtype == torch.bool
    assert torch.equal(mask, seed == 0)
    assert torch.equal(mask, from_padding_convention(seed))


@pytest.mark.parametrize("name", KERNELS)
def test_padding_keys_get_exactly_zero_weight(name):
    q = torch.tensor([[0, 0, 10]], dtype=torch.float32)
    mask = torch.tensor([True, True, True, False])[None, None, None]  # the last key is padding
    out = _attend(name, q, mask=mask)
    # weights [0, 0, 1, 0]: only V[2] remains
    torch.testing.assert_close(out, torch.tensor([[100.0, 5.0]]), rtol=0, atol=1e-4)


def _reference(q, k, v, mask, bias=None):
    """The formula in float64, written out independently of the kernels."""
    q, k, v = q.double(), k.double(), v.double()
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if bias is not None:
        scores = scores + bias.double()
    scores = scores.masked_fill(~mask, -math.inf)
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # rows with no key -> 0
    return weights @ v


def _random_case(seed: int, dtype: torch.dtype):
    gen = torch.Generator().manual_seed(seed)
    batch, heads, q_len, k_len, dim = 3, 4, 7, 9, 16
    q = torch.randn(batch, heads, q_len, dim, generator=gen)
    k = torch.randn(batch, heads, k_len, dim, generator=gen)
    v = torch.randn(batch, heads, k_len, dim, generator=gen)
    real = torch.rand(batch, 1, 1, k_len, generator=gen) > 0.3
    real[1] = False  # a row whose every key is padding
    causal = torch.ones(q_len, k_len, dtype=torch.bool).tril(k_len - q_len)
    causal[0] = False  # and a query row that sees nothing through the causal mask alone
    mask = real & causal
    return q.to(dtype), k.to(dtype), v.to(dtype), mask


def _fp16_resolution(reference: torch.Tensor) -> torch.Tensor:
    """Half a float16 step at each value: the best a float16 result can do."""
    exponent = torch.floor(torch.log2(reference.abs().clamp(min=2.0**-14)))
    return 0.5 * 2.0 ** (exponent - 10)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kernels_agree_float32(seed):
    q, k, v, mask = _random_case(seed, torch.float32)
    expected = _reference(q, k, v, mask)
    outs = {name: _kernel(name)(q, k, v, mask=mask) for name in KERNELS}
    for name, out in outs.items():
        assert out.dtype == torch.float32
        assert torch.isfinite(out).all(), name
        torch.testing.assert_close(out.double(), expected, rtol=0, atol=1e-5, msg=name)
        torch.testing.assert_close(out, outs["matmul"], rtol=0, atol=1e-5, msg=name)
    for out in outs.values():
        assert torch.equal(out[1], torch.zeros_like(out[1]))  # all keys padding -> zeros
        assert torch.equal(out[:, :, 0], torch.zeros_like(out[:, :, 0]))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kernels_agree_float16(seed):
    """float16 outputs are the float64 answer rounded once (within 1e-5 beyond the rounding).

    float16's step is about 1e-3 near 1, so two correctly rounded results may still differ
    by one step where the exact value sits on a rounding boundary; that is all we allow.
    """
    q, k, v, mask = _random_case(seed, torch.float16)
    expected = _reference(q, k, v, mask)
    allowed = _fp16_resolution(expected) + 1e-5
    outs = {name: _kernel(name)(q, k, v, mask=mask) for name in KERNELS}
    for name, out in outs.items():
        assert out.dtype == torch.float16
        assert torch.isfinite(out).all(), name
        error = (out.double() - expected).abs()
        assert (error <= allowed).all(), f"{name}: max error {error.max():.3g}"
        assert torch.equal(out[1], torch.zeros_like(out[1]))
    for name in KERNELS[1:]:
        differ = (outs[name] != outs["matmul"]).float().mean()
        assert differ <= 0.01, f"{name} differs from matmul in {differ:.1%} of values"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_kernels_agree_with_score_bias(dtype):
    q, k, v, mask = _random_case(3, dtype)
    bias = -torch.rand(1, 4, 7, 9) * 3
    expected = _reference(q, k, v, mask, bias)
    atol = 1e-5 if dtype == torch.float32 else _fp16_resolution(expected) + 1e-5
    for name in KERNELS:
        out = _kernel(name)(q, k, v, mask=mask, bias=bias)
        assert ((out.double() - expected).abs() <= atol).all(), name


@pytest.mark.parametrize("name", KERNELS)
def test_unmasked_call(name):
    q, k, v, _ = _random_case(4, torch.float32)
    expected = _reference(q, k, v, torch.ones(1, dtype=torch.bool))
    torch.testing.assert_close(_kernel(name)(q, k, v).double(), expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", KERNELS)
def test_float_mask_is_refused_with_a_conversion_hint(name):
    q, k, v, mask = _random_case(5, torch.float32)
    with pytest.raises(tk.MaskError, match=r"from_keep_convention"):
        _kernel(name)(q, k, v, mask=mask.float())


@pytest.mark.parametrize("name", KERNELS)
def test_mask_of_wrong_rank_is_refused(name):
    q, k, v, mask = _random_case(5, torch.float32)
    with pytest.raises(tk.MaskError, match=r"mask\[:, None, None, :\]"):
        _kernel(name)(q, k, v, mask=mask[:, 0, 0, :])


@pytest.mark.parametrize("name", KERNELS)
def test_float16_fully_masked_is_finite(name):
    q = torch.full((1, 1, 2, 4), 100.0, dtype=torch.float16)
    mask = torch.zeros(1, 1, 2, 3, dtype=torch.bool)
    out = _kernel(name)(q, q[:, :, :1].expand(1, 1, 3, 4), q[:, :, :1].expand(1, 1, 3, 4),
                        mask=mask)
    assert torch.equal(out, torch.zeros_like(out))


def test_scale_parameter_is_validated():
    with pytest.raises(tk.ConfigError, match=r"scale"):
        tk.get_registry().create("attention", "matmul", scale=-1.0)


@pytest.mark.parametrize("name", KERNELS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_softcapped_scores_equal_the_formula(name, dtype):
    """softcap c: scores c * tanh(q k^T * scale / c) (Gemma 2), within 1e-5 of float64 for
    float32 and within float16's rounding (plus 1e-3) for half inputs."""
    q, k, v, mask = _random_case(0, dtype)
    q = q * 3  # large scores, so the cap bites
    qd, kd, vd = q.double(), k.double(), v.double()
    scores = torch.tanh(qd @ kd.transpose(-2, -1) * 0.3 / 1.5) * 1.5
    weights = torch.softmax(scores.masked_fill(~mask, -math.inf), dim=-1).nan_to_num(0.0)
    expected = weights @ vd
    out = tk.get_registry().create("attention", name, scale=0.3, softcap=1.5)(q, k, v, mask=mask)
    assert out.dtype == dtype
    atol = 1e-5 if dtype == torch.float32 else 1e-3
    torch.testing.assert_close(out.double(), expected, rtol=0, atol=atol, msg=name)
    uncapped = tk.get_registry().create("attention", name, scale=0.3)(q, k, v, mask=mask)
    assert (uncapped.double() - expected).abs().max() > 10 * atol  # the cap changes the result


@pytest.mark.parametrize("bad", [0, -2.0, float("inf"), True, "1"])
def test_softcap_parameter_is_validated(bad):
    with pytest.raises(tk.ConfigError, match=r"softcap must be a positive number or null"):
        tk.get_registry().create("attention", "sdpa", softcap=bad)


def _sink_reference(q, k, v, mask, sinks):
    """Attention with sinks in float64, written out: each row's exp(scores) over the visible
    keys and exp(sink) of its head, the sink's share dropped."""
    q, k, v = q.double(), k.double(), v.double()
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    top = torch.maximum(scores.masked_fill(~mask, -math.inf).amax(-1, keepdim=True),
                        sinks.double()[None, :, None, None])
    exp = torch.exp(scores - top).masked_fill(~mask, 0.0)
    total = exp.sum(-1, keepdim=True) + torch.exp(sinks.double()[None, :, None, None] - top)
    return (exp / total) @ v


@pytest.mark.parametrize("name", KERNELS)
def test_sinks_join_the_denominator_and_a_row_without_keys_stays_zero(name):
    q, k, v, mask = _random_case(5, torch.float32)
    kernel = tk.get_registry().create("attention", name, context={"num_heads": 4}, sinks=True)
    with torch.no_grad():
        kernel.sinks.copy_(torch.tensor([-1.0, 0.0, 2.0, 5.0]))
    out = kernel(q, k, v, mask=mask)
    expected = _sink_reference(q, k, v, mask, kernel.sinks.detach())
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-6)
    assert not out[1].any()  # no visible key: zeros (the sink alone takes the weight)
    plain = _kernel(name)(q, k, v, mask=mask)
    assert (out[0].norm(dim=-1) < plain[0].norm(dim=-1) + 1e-6).all()  # the sink only takes weight


def test_sinks_need_the_model_s_heads():
    with pytest.raises(tk.ConfigError, match=r"sinks need the model's num_heads"):
        tk.get_registry().create("attention", "sdpa", sinks=True)
    with pytest.raises(tk.ConfigError, match=r"sinks must be true or false"):
        tk.get_registry().create("attention", "sdpa", context={"num_heads": 2}, sinks=1)


def test_a_model_with_sinks_exports_them_explicitly_and_caches_exactly(tmp_path):
    """Sinks in a decoder (sliding and full layers, padded rows): cached steps give the
    uncached tokens, and the export (scores, a sink column, softmax, the column dropped; no
    fused Attention op, which has no sinks) gives PyTorch's logits and tokens."""
    import numpy as np
    import onnx

    from transformer_kit.export import export_onnx
    from transformer_kit.export.verify import relative_error
    from transformer_kit.runtime import OnnxModel

    torch.manual_seed(6)
    model = tk.build_model({
        "architecture": "decoder", "vocab_size": 40, "d_model": 16, "num_heads": 4, "num_kv_heads": 2,
        "num_layers": 2, "d_ff": 24, "dropout": 0.0, "attention": {"name": "sdpa", "sinks": True},
        "positional": "rotary", "block": "pre_norm", "norm": "rmsnorm",
        "layer_types": ["sliding", "full"],
        "layer_variants": {"sliding": {"mask": {"name": "sliding_window", "window": 3}}, "full": {}}}).eval()
    with torch.no_grad():
        for layer in model.decoder.layers:
            layer.self_attention.kernel.sinks.normal_(std=2.0)
    ids = torch.randint(3, 40, (2, 8))
    ids[1, 5:] = 0
    mask = (ids != 0).long()
    tokens = model.generate(ids, max_new_tokens=5, attention_mask=mask)
    assert torch.equal(tokens, model.generate(ids, max_new_tokens=5, attention_mask=mask, use_cache=False))
    export_onnx(model, tmp_path / "onnx")  # verified against PyTorch
    graph = onnx.load(tmp_path / "onnx" / "model.onnx", load_external_data=False).graph
    ops = {n.op_type for n in graph.node}
    assert "Attention" not in ops and "Softmax" in ops
    om = OnnxModel(tmp_path / "onnx", providers="cpu")
    with torch.no_grad():
        expected = model(ids, attention_mask=mask).numpy()
    real = mask.numpy().astype(bool)
    assert relative_error(om(ids.numpy(), attention_mask=mask.numpy())[real], expected[real]) <= 1e-4
    np.testing.assert_array_equal(om.generate(ids.numpy(), max_new_tokens=5, attention_mask=mask.numpy()),
                                  tokens.numpy())
