"""CUDA kernels without a GPU: every op of every graph the kit exports (float32, float16, int4;
decoder, encoder, encoder-decoder) has a kernel in onnxruntime's CUDA execution provider for the
types it is given, or is a CPU fallback that docs/export.md names with its cost.

Runs on every machine (tests/gpu runs the exports on a GPU where there is one): it reads the
table of CUDA kernels registered in the pinned onnxruntime-gpu wheel
(``data/cuda_kernels_onnxruntime_1.31.1.json``: its source line says how it was read) and looks
each node up by domain, op, the version of the op's schema at the graph's opset, and the element
type of each input.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path

import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto

import transformer_kit as tk
from tests.combinations import tiny_config
from transformer_kit.export import Int4, export_onnx
from transformer_kit.runtime.onnx_model import SHARED_STEP

TABLE = Path(__file__).parent / "data" / "cuda_kernels_onnxruntime_1.31.1.json"
DOCS = Path(__file__).parents[2] / "docs" / "export.md"
#: (domain, op) -> what docs/export.md must say of it: ops that run on the CPU under CUDA.
CPU_FALLBACKS: dict[tuple[str, str], str] = {}

MODELS = {
    "llama-style decoder": ("decoder", {"attention": "sdpa", "positional": "rotary", "norm": "rmsnorm",
                                        "feedforward": "swiglu", "block": "pre_norm", "pad_id": 0,
                                        "tie_embeddings": True}),
    "gpt2-style decoder": ("decoder", {"attention": "sdpa", "positional": "learned", "norm": "layernorm",
                                       "feedforward": "gelu", "block": "pre_norm", "pad_id": 0}),
    "bert-style encoder": ("encoder", {"positional": "learned", "feedforward": "gelu", "pad_id": 0}),
    "paper encoder-decoder": ("encoder_decoder", {"pad_id": 0, "bos_id": 1}),
    **{f"sentence encoder, {pooling} pooling": ("encoder", {
        "attention": "sdpa", "positional": "learned", "feedforward": "gelu", "pad_id": 0,
        "pooling": pooling, "sentence_embedding": extra}) for pooling, extra in [
            ("cls", {"normalize": True}), ("lasttoken", {}), ("max", {}), ("mean_sqrt_len", {}),
            ("weightedmean", {"include_prompt": False, "normalize": True,
                              "dense": [{"in_features": 32, "out_features": 8}]})]},
    "cross-encoder": ("encoder", {"attention": "sdpa", "positional": {"name": "learned", "token_types": 2},
                                  "feedforward": "gelu", "pad_id": 0, "classifier": {"num_labels": 1}}),
}
EXPORTS = [(name, "float32") for name in MODELS] + [
    ("llama-style decoder", "float16"), ("llama-style decoder", "int4"),
    ("llama-style decoder", "int4 float16"), ("paper encoder-decoder", "int4 float16"),
    ("gpt2-style decoder", "int4"), ("paper encoder-decoder", "float16"),
    ("sentence encoder, weightedmean pooling", "float16"), ("cross-encoder", "float16")]


@cache
def kernels() -> dict[tuple[str, str], list[dict]]:
    table = json.loads(TABLE.read_text())
    assert table["onnxruntime"] == "1.31.1" and "get_all_opkernel_def" in table["source"]
    found: dict[tuple[str, str], list[dict]] = {}
    for kernel in table["kernels"]:
        found.setdefault((kernel["domain"], kernel["op"]), []).append(kernel)
    return found


@cache
def contrib_schemas() -> dict[tuple[str, str], list]:
    from onnxruntime.capi import _pybind_state

    found: dict[tuple[str, str], list] = {}
    for schema in _pybind_state.get_all_operator_schema():
        found.setdefault((schema.domain, schema.name), []).append(schema)
    return found


def _schema(domain: str, op: str, opset: int) -> tuple[int, list[str]]:
    """(the op's schema version at ``opset``, its inputs' type strings)."""
    if domain in ("", "ai.onnx"):
        schema = onnx.defs.get_schema(op, opset, "")
        return schema.since_version, [i.type_str for i in schema.inputs]
    schema = max((s for s in contrib_schemas()[(domain, op)] if s.since_version <= opset),
                 key=lambda s: s.since_version)
    return schema.since_version, [i.typeStr for i in schema.inputs]


def _type_name(elem_type: int) -> str:
    return TensorProto.DataType.Name(elem_type).lower()


def _typed(path: Path, tmp: Path) -> onnx.ModelProto:
    """The graph with every value's type, as onnxruntime resolves it (no optimization)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.optimized_model_filepath = str(tmp / f"typed-{path.name}")
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return onnx.load(str(tmp / f"typed-{path.name}"), load_external_data=False)


def missing_kernels(proto: onnx.ModelProto) -> list[str]:
    """Each node without a CUDA kernel for its domain, op, version and input types, said."""
    graph = proto.graph
    types = {v.name: v.type.tensor_type.elem_type for v in [*graph.input, *graph.value_info, *graph.output]}
    types.update({t.name: t.data_type for t in graph.initializer})
    opsets = {o.domain: o.version for o in proto.opset_import}
    opsets.setdefault("", opsets.get("ai.onnx", 0))
    problems = []
    for node in graph.node:
        if node.op_type == "Constant":  # folded into an initializer when the session is made
            continue
        version, formal = _schema(node.domain, node.op_type, opsets[node.domain])
        given = {}
        for index, name in enumerate(node.input):
            if name and name in types:
                given.setdefault(formal[min(index, len(formal) - 1)], set()).add(_type_name(types[name]))
        candidates = [k for k in kernels().get((node.domain, node.op_type), [])
                      if k["since"][0] <= version and (k["since"][1] is None or version <= k["since"][1])]
        fits = [k for k in candidates
                if all(not set(types) - set(k["types"].get(c, types)) for c, types in given.items())]
        if not fits:
            problems.append(f"{node.domain or 'ai.onnx'}::{node.op_type} (version {version}, inputs "
                            f"{ {c: sorted(t) for c, t in given.items()} }): "
                            + ("no CUDA kernel of that version" if not candidates else
                               f"CUDA kernels take {[k['types'] for k in candidates]}"))
    return problems


@pytest.mark.parametrize(("name", "precision"), EXPORTS, ids=[f"{n}-{p}" for n, p in EXPORTS])
def test_every_exported_op_has_a_cuda_kernel(name, precision, tmp_path):
    architecture, overrides = MODELS[name]
    torch.manual_seed(0)
    model = tk.build_model(tiny_config(architecture, vocab_size=64, d_model=32, d_ff=64, **overrides)).eval()
    quantize = Int4(block_size=16) if precision.startswith("int4") else None
    export_onnx(model, tmp_path / "onnx", dtype="float16" if precision.endswith("float16") else "float32",
                quantize=quantize, verify=False)
    problems = []
    for path in sorted((tmp_path / "onnx").glob("*.onnx")):
        if path.stem == SHARED_STEP:  # the runtime runs the shared cache buffer on the CPU only
            continue
        problems += [f"{path.name}: {p}" for p in missing_kernels(_typed(path, tmp_path))
                     if tuple(re.match(r"([\w.]+)::(\w+)", p).groups()) not in CPU_FALLBACKS]
    assert not problems, "\n".join(problems)


def test_the_table_catches_an_op_without_a_cuda_kernel(tmp_path):
    """A graph with an op the CUDA provider lacks (ai.onnx Det) and one with a type its kernel
    does not take (Gather of a string table is fine on CPU; Sigmoid of int32 is no op at all, so
    use CumSum of int8) are both reported."""
    x = onnx.helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])
    y = onnx.helper.make_tensor_value_info("y", TensorProto.FLOAT, [])
    det = onnx.helper.make_model(onnx.helper.make_graph(
        [onnx.helper.make_node("Det", ["x"], ["y"])], "det", [x], [y]),
        opset_imports=[onnx.helper.make_opsetid("", 23)])
    assert "no CUDA kernel" in missing_kernels(det)[0]
    a = onnx.helper.make_tensor_value_info("a", TensorProto.INT8, [4])
    axis = onnx.helper.make_tensor("axis", TensorProto.INT64, [], [0])
    b = onnx.helper.make_tensor_value_info("b", TensorProto.INT8, [4])
    cumsum = onnx.helper.make_model(onnx.helper.make_graph(
        [onnx.helper.make_node("CumSum", ["a", "axis"], ["b"])], "cumsum", [a], [b], [axis]),
        opset_imports=[onnx.helper.make_opsetid("", 23)])
    assert "CUDA kernels take" in missing_kernels(cumsum)[0]


def test_the_documented_fallbacks_are_in_the_export_guide():
    text = DOCS.read_text()
    for (_, op), cost in CPU_FALLBACKS.items():
        assert op in text and cost in text
