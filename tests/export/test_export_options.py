"""export_onnx options and refusals: float16, int8, optimization, opsets, plugins' translations,
unexportable components, and an output folder that is never left half-written."""

from __future__ import annotations

import copy

import numpy as np
import onnx
import pytest
import torch

import transformer_kit as tk
from tests.combinations import tiny_config
from tests.export import fused_norm_plugin
from transformer_kit.export import export_onnx
from transformer_kit.export.verify import VERIFY_SHAPES, random_ids, relative_error
from transformer_kit.runtime import OnnxModel


def _model(architecture="decoder", **overrides):
    torch.manual_seed(0)
    return tk.build_model(tiny_config(architecture, **overrides)).eval()


def _op_types(path) -> set[str]:
    return {node.op_type for node in onnx.load(str(path), load_external_data=False).graph.node}


def test_float16_export_stays_close_and_finite_with_padding(tmp_path):
    model = _model("encoder_decoder", attention="sdpa", positional="rotary", block="pre_norm")
    report = export_onnx(model, tmp_path / "fp16", dtype="float16")
    assert report.dtype == "float16" and report.tolerance == 2e-2
    assert report.max_error <= 2e-2
    # one copy of each half-precision weight across the three graphs (encoder_decoder)
    assert report.graph_bytes["weights.data"] <= 1.05 * report.weight_bytes + 64 * 1024
    assert report.weight_bytes < 0.6 * sum(p.numel() * 4 for p in model.parameters())
    om = OnnxModel(tmp_path / "fp16", providers="cpu")
    src = random_ids(3, 12, 37, 0, seed=1)
    src[2] = 0  # a row of padding only
    tgt = random_ids(3, 5, 37, 0, seed=2, pad_rows=False)
    out = om(src.numpy(), tgt.numpy())
    assert out.dtype == np.float16
    assert np.isfinite(out).all()
    with torch.no_grad():
        expected = model(src, tgt).numpy()
    assert relative_error(out, expected) <= 2e-2
    assert om.generate(src.numpy(), 5).shape[0] == 3


def test_int8_quantization_reports_its_error_and_agrees_on_the_next_token(tmp_path):
    model = _model("decoder", d_model=64, num_heads=4, d_ff=128, vocab_size=200)
    report = export_onnx(model, tmp_path / "int8", quantize="int8")
    assert report.quantization == "int8" and report.tolerance is None
    assert 0 < report.max_error < 0.05
    fp32 = export_onnx(model, tmp_path / "fp32")
    assert report.graph_bytes["weights.data"] < 0.6 * fp32.graph_bytes["weights.data"]
    prompts = random_ids(64, 12, 200, None, seed=5).numpy()
    int8 = OnnxModel(tmp_path / "int8", providers="cpu")(prompts)[:, -1].argmax(-1)
    with torch.no_grad():
        reference = model(torch.from_numpy(prompts))[:, -1].argmax(-1).numpy()
    assert (int8 == reference).mean() >= 0.9
    assert "MatMulInteger" in _op_types(tmp_path / "int8" / "model.onnx")


def _avx2_int8_products(activations: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """uint8 (M, K) x int8 (K, N) as x86 CPUs without VNNI compute it (VPMADDUBSW): adjacent
    products along K summed in pairs into int16, saturating, then added up in int32."""
    a, w = activations.astype(np.int32), weights.astype(np.int32)
    pairs = a[:, 0::2, None] * w[None, 0::2] + a[:, 1::2, None] * w[None, 1::2]
    return np.clip(pairs, -32768, 32767).sum(axis=1)


def test_int8_products_are_exact_on_cpus_without_vnni(tmp_path):
    """The int8 weights cannot saturate the int16 pair sums of AVX2 / AVX-512 without VNNI, so
    those CPUs compute the same products as this one (checked on every quantized matrix with
    the worst uint8 activations and random ones)."""
    model = _model("decoder", d_model=64, num_heads=4, d_ff=128, vocab_size=200)
    export_onnx(model, tmp_path / "int8", quantize="int8")
    graph = onnx.load(str(tmp_path / "int8" / "model.onnx")).graph
    weights = {i.name: onnx.numpy_helper.to_array(i) for i in graph.initializer}
    products = [weights[n.input[1]] for n in graph.node
                if n.op_type == "MatMulInteger" and n.input[1] in weights]
    assert products and all(w.dtype == np.int8 for w in products)
    rng = np.random.default_rng(0)
    for w in products:
        for a in (np.full((1, w.shape[0]), 255, np.uint8),
                  rng.integers(0, 256, (8, w.shape[0]), dtype=np.uint8)):
            np.testing.assert_array_equal(_avx2_int8_products(a, w), a.astype(np.int32) @ w.astype(np.int32))
        assert np.abs(w.astype(np.int32)).max() <= 64  # 255 * (64 + 64) = 32640 <= 32767


def test_optimization_is_measured_and_kept_only_when_verified(tmp_path):
    model = _model("decoder", d_model=64, num_heads=4)
    report = export_onnx(model, tmp_path / "opt", optimize=True)
    opt = report.optimization
    assert opt["verified"] is True
    assert opt["forward_ms"]["original"] > 0 and opt["forward_ms"]["optimized"] > 0
    assert opt["kept"] == (opt["forward_ms"]["optimized"] <= 1.05 * opt["forward_ms"]["original"])
    assert opt["nodes"]["model"]["optimized"] <= opt["nodes"]["model"]["original"]
    om = OnnxModel(tmp_path / "opt", providers="cpu")
    ids = random_ids(2, 6, 37, 0, seed=3)
    with torch.no_grad():
        assert relative_error(om(ids.numpy()), model(ids).numpy()) <= 1e-4
    assert sorted(p.name for p in (tmp_path / "opt").iterdir()) == [
        "decoder_step.onnx", "manifest.json", "model.onnx", "weights.data"]


def test_opset_18_decomposes_sdpa_and_23_uses_the_attention_op(tmp_path):
    model = _model("encoder", attention="sdpa")
    export_onnx(model, tmp_path / "o18", opset=18)
    export_onnx(model, tmp_path / "o23")
    assert "Attention" not in _op_types(tmp_path / "o18" / "model.onnx")
    assert "Attention" in _op_types(tmp_path / "o23" / "model.onnx")
    assert OnnxModel(tmp_path / "o18").manifest.opset == 18


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dtype": "int4"}, "dtype='int4' is not supported"),
        ({"quantize": "int3"}, "quantize='int3' is not supported; choose None, 'int8', 'int4'"),
        ({"opset": 12}, r"opset=12 is not supported; choose 18..23"),
        ({"dtype": "float16", "quantize": "int8"}, "starts from a float32 export"),
    ],
)
def test_bad_arguments_are_refused(tmp_path, kwargs, message):
    with pytest.raises(tk.InputError, match=message):  # the call's arguments, not a failed export
        export_onnx(_model("encoder"), tmp_path / "x", **kwargs)
    assert not (tmp_path / "x").exists()


def test_only_assembled_models_are_exported(tmp_path):
    with pytest.raises(tk.InputError, match=r"takes a model from transformer_kit.build_model"):
        export_onnx(torch.nn.Linear(2, 2), tmp_path / "x")


def test_unexportable_component_is_named(tmp_path, fresh_registry):
    from transformer_kit.plugins.attention import MatmulAttention

    plugin = fused_norm_plugin._plugin("eager_only", transformer_kit_components=lambda: [
        tk.Component("attention", "eager", MatmulAttention, exportable=False,
                     provides={"score_bias"})])
    tk.register_plugin(plugin)
    with pytest.raises(tk.ExportError, match=r"attention 'eager' \(plugin 'eager_only'\) declares "
                                             "itself not exportable"):
        export_onnx(_model("decoder", attention="eager"), tmp_path / "x")


def test_a_plugin_translation_exports_a_custom_op(tmp_path, fresh_registry):
    tk.register_plugin(fused_norm_plugin.components())
    model = _model("decoder", norm="fused_rmsnorm", block="pre_norm")
    with pytest.raises(tk.ExportError, match=r"transformer_kit_onnx_translations"):
        export_onnx(model, tmp_path / "none")
    tk.register_plugin(fused_norm_plugin.translation())
    report = export_onnx(model, tmp_path / "ok")
    assert report.max_error <= 1e-4 and report.tokens_match
    # the plugin's op, or onnxruntime's fusion of it with the residual sum before it
    ops = _op_types(tmp_path / "ok" / "model.onnx")
    assert {"RMSNormalization", "SkipSimplifiedLayerNormalization"} & ops
    ids = random_ids(3, 8, 37, 0, seed=4)
    with torch.no_grad():
        expected = model.generate(ids, 6).numpy()
    np.testing.assert_array_equal(OnnxModel(tmp_path / "ok").generate(ids.numpy(), 6), expected)


def test_verification_catches_a_wrong_translation_and_keeps_the_old_export(tmp_path, fresh_registry):
    tk.register_plugin(fused_norm_plugin.components())
    model = _model("encoder", norm="fused_rmsnorm", block="pre_norm")
    tk.register_plugin(fused_norm_plugin.translation(), name="good")
    export_onnx(model, tmp_path / "out")
    before = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()}
    tk.unregister_plugin("good")
    tk.register_plugin(fused_norm_plugin.wrong_translation())
    with pytest.raises(tk.ExportError, match=r"do not match PyTorch: relative error"):
        export_onnx(model, tmp_path / "out")
    assert {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temporary folder left


def test_the_float32_tolerance_allows_for_pytorchs_own_float32_spread(tmp_path):
    """The default tolerance is 1e-4 or 4x PyTorch's float32 error against float64 on the
    verification's inputs, whichever is larger (a correct export of a model that rounds more
    must pass on every CPU: the T5 family's tests have such a model); a tolerance given is used
    as given."""
    model = _model("decoder")
    reference = copy.deepcopy(model).double()
    spread = 0.0
    for seed, (batch, length) in enumerate(VERIFY_SHAPES):
        ids = random_ids(batch, length, model.config.vocab_size, model.config.pad_id, seed)
        with torch.no_grad():
            spread = max(spread, relative_error(model(ids).numpy(), reference(ids).numpy()))
    report = export_onnx(model, tmp_path / "default")
    assert report.float32_spread == pytest.approx(spread, rel=1e-6)
    assert report.tolerance == max(1e-4, 4 * spread)
    assert report.max_error <= report.tolerance
    given = export_onnx(model, tmp_path / "given", tolerance=0.5)
    assert given.tolerance == 0.5 and given.float32_spread is None


def test_a_folder_with_other_files_is_never_overwritten(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(tk.ExportError, match=r"not an earlier export"):
        export_onnx(_model("encoder"), tmp_path / "mine")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]


def test_re_export_replaces_an_earlier_export(tmp_path):
    export_onnx(_model("encoder", d_model=8, num_heads=2), tmp_path / "out")
    export_onnx(_model("encoder", d_model=16), tmp_path / "out")
    assert OnnxModel(tmp_path / "out").manifest.config["d_model"] == 16
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_an_export_that_would_not_fit_in_memory_is_refused_before_it_starts(tmp_path, monkeypatch):
    """The estimate (the largest tensor in copies, the tracing, verification's session and
    layers) against the memory available: refused with the estimate and what would fit, and
    nothing written."""
    from transformer_kit.export import memory_estimate

    model = _model("decoder")
    needs = memory_estimate.estimate(model, None, "float32")
    assert needs.writing < needs.verifying  # verification holds the session over the export too
    monkeypatch.setattr(memory_estimate, "available_memory", lambda: (needs.writing + needs.verifying) // 2)
    with pytest.raises(tk.ExportError, match=r"needs about [\d.]+ GB of memory at its peak .* more than the "
                       r"[\d.]+ GB available now\. What would fit: verify=False \(--no-verify\) needs about"):
        export_onnx(model, tmp_path / "out")
    assert not list(tmp_path.iterdir())
    assert export_onnx(model, tmp_path / "out", verify=False).errors == {}  # what the message said fits
