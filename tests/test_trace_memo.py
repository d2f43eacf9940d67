"""The suite's trace memo (tests/trace_memo.py): a hit writes the bytes a fresh trace writes,
and whatever changes the trace changes the fingerprint."""

from __future__ import annotations

import os

import pytest
import torch

import transformer_kit as tk
from tests.combinations import tiny_config
from tests.trace_memo import MEMO, Uncacheable, fingerprint
from transformer_kit.export import export_onnx
from transformer_kit.export.graphs import graph_specs
from transformer_kit.export.tracing import skeleton

CONFIG = tiny_config("decoder", attention={"name": "sdpa", "scale": 0.3}, positional="rotary",
                     norm="rmsnorm", feedforward="swiglu", block="pre_norm")


def _onnx_bytes(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def _step_fingerprint(config: dict) -> str:
    torch.manual_seed(0)
    model, _ = skeleton(tk.build_model(config).eval())
    spec = graph_specs(model)["decoder_step"]
    return fingerprint(spec.module, spec.args, {"dynamo": True, "dynamic_shapes": spec.dynamic_shapes})


@pytest.mark.skipif(bool(os.environ.get("TK_FRESH_TRACES")), reason="TK_FRESH_TRACES: no memo")
def test_a_hit_writes_the_bytes_a_fresh_trace_writes(tmp_path):
    torch.manual_seed(0)
    model = tk.build_model(CONFIG).eval()
    was = MEMO.enabled
    try:
        MEMO.enabled = False
        export_onnx(model, tmp_path / "fresh", verify=False)
        MEMO.enabled = True
        export_onnx(model, tmp_path / "first", verify=False)
        hits = MEMO.hits
        export_onnx(model, tmp_path / "copy", verify=False, quantize="int4")
        export_onnx(model, tmp_path / "again", verify=False)
    finally:
        MEMO.enabled = was
    assert MEMO.hits - hits == 4  # the model and step graphs, twice
    fresh = _onnx_bytes(tmp_path / "fresh")
    assert _onnx_bytes(tmp_path / "first") == fresh
    assert _onnx_bytes(tmp_path / "again") == fresh


@pytest.mark.parametrize("change", [
    {"num_kv_heads": 1}, {"attention": {"name": "sdpa", "scale": 0.2}},
    {"norm": {"name": "rmsnorm", "eps": 1e-5}}, {"feedforward": "geglu"}, {"num_layers": 3},
], ids=lambda c: next(iter(c)))
def test_what_changes_the_trace_changes_the_fingerprint(change):
    assert _step_fingerprint(CONFIG) == _step_fingerprint(CONFIG)
    assert _step_fingerprint({**CONFIG, **change}) != _step_fingerprint(CONFIG)


def test_a_class_defined_in_a_function_is_never_memoized():
    class Local(torch.nn.Module):
        def forward(self, x):
            return x + 1

    with pytest.raises(Uncacheable, match="qualified name"):
        fingerprint(Local(), (torch.empty(2, device="meta"),), {"dynamo": True})
