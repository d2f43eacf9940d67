"""A stack of identical layers is traced with three of them and repeated in the graph: the graphs
compute what tracing every layer gives, bit for bit in onnxruntime, with the same inputs and
outputs; a stack whose layers differ is traced whole."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch

import transformer_kit as tk
from tests.export.cases import sampled_cases
from transformer_kit.export import export_onnx, exporter
from transformer_kit.export.graphs import graph_specs
from transformer_kit.export.layer_replication import extend_layers
from transformer_kit.export.layer_stacks import TRACED_LAYERS, repeatable_stack
from transformer_kit.export.tracing import skeleton, trace_graph

LAYERS = 5
CASES = [(i, c, None, "float32") for i, c in sampled_cases("decoder", 3) + sampled_cases("encoder", 2)]
CASES += [(CASES[0][0] + "-int4", CASES[0][1], "int4", "float32"),
          (CASES[1][0] + "-float16", CASES[1][1], None, "float16")]
DIMS = {"batch": 2, "length": 6, "new": 2, "past": 4, "total": 6, "kept": 2}


def _feeds(session: ort.InferenceSession, vocab: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs for every graph input: token ids, a left-padded mask, cache tensors, and
    every new position for the step's logits."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for spec in session.get_inputs():
        shape = [d if isinstance(d, int) else DIMS[d] for d in spec.shape]
        if spec.name.endswith("ids"):
            feeds[spec.name] = rng.integers(1, vocab, shape, dtype=np.int64)
        elif spec.name == "logit_positions":  # both new positions' logits
            feeds[spec.name] = np.arange(DIMS["new"], dtype=np.int64)
        elif spec.name.endswith("mask"):
            mask = np.ones(shape, np.int64)
            mask[0, 0] = 0
            feeds[spec.name] = mask
        else:
            dtype = np.float16 if "float16" in spec.type else np.float32
            feeds[spec.name] = rng.standard_normal(shape).astype(dtype)
    return feeds


@pytest.mark.parametrize(("config", "quantize", "dtype"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_repeated_layers_compute_what_tracing_every_layer_does(config, quantize, dtype, tmp_path,
                                                               monkeypatch):
    torch.manual_seed(0)
    model = tk.build_model({**config, "num_layers": LAYERS}).eval()
    repeated = export_onnx(model, tmp_path / "repeated", verify=False, quantize=quantize, dtype=dtype)
    monkeypatch.setattr(exporter, "repeatable_stack", lambda model: None)
    whole = export_onnx(model, tmp_path / "whole", verify=False, quantize=quantize, dtype=dtype)

    graphs = sorted(path.stem for path in (tmp_path / "repeated").glob("*.onnx"))
    assert repeated.layers_traced == dict.fromkeys(graphs, TRACED_LAYERS)
    assert whole.layers_traced == {}
    for name in graphs:
        a, b = (ort.InferenceSession(str(tmp_path / kind / f"{name}.onnx"),
                                     providers=["CPUExecutionProvider"]) for kind in ("repeated", "whole"))
        assert [i.name for i in a.get_inputs()] == [i.name for i in b.get_inputs()]
        assert [o.name for o in a.get_outputs()] == [o.name for o in b.get_outputs()]
        feeds = _feeds(a, config["vocab_size"])
        for got, want in zip(a.run(None, feeds), b.run(None, feeds), strict=True):
            np.testing.assert_array_equal(got, want)


def _five_layers() -> torch.nn.Module:
    torch.manual_seed(0)
    return tk.build_model({**sampled_cases("decoder", 1)[0][1], "num_layers": LAYERS}).eval()


def test_a_stack_whose_later_layer_differs_is_traced_whole_and_verifies(tmp_path):
    model = _five_layers()
    assert repeatable_stack(model) == "decoder"
    model.decoder.layers[4].ff_norm.eps = 0.25  # beyond the traced layers: found by comparing modules
    assert repeatable_stack(model) is None
    report = export_onnx(model, tmp_path / "onnx")
    assert report.layers_traced == {}
    assert report.max_error < report.tolerance


def test_a_graph_that_does_not_repeat_is_left_as_traced():
    model = _five_layers()
    model.decoder.layers[2].ff_norm.eps = 0.25  # the third traced layer is not the second again
    traced, buffers = skeleton(model)
    traced.decoder.layers = traced.decoder.layers[:TRACED_LAYERS]
    spec = graph_specs(traced)["model"]
    graph = trace_graph("model", spec, 23, {}, buffers, "")
    before = len(graph.graph)
    assert not extend_layers(graph, "decoder", TRACED_LAYERS, LAYERS)
    assert len(graph.graph) == before


def test_the_last_traced_layer_is_what_the_copies_repeat():
    """A traced graph that repeats is extended with each layer's own weights, once each."""
    model = _five_layers()
    traced, buffers = skeleton(model)
    traced.decoder.layers = traced.decoder.layers[:TRACED_LAYERS]
    graph = trace_graph("model", graph_specs(traced)["model"], 23, {}, buffers, "")
    assert extend_layers(graph, "decoder", TRACED_LAYERS, LAYERS)
    weights = {name for name, value in graph.graph.initializers.items() if value.const_value is None}
    expected = {name for name, _ in model.named_parameters()}
    assert weights == expected
