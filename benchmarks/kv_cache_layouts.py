"""The attention ops of a decoding step alone, under three key/value cache layouts, by context length.

One ONNX graph per layout holds ``--layers`` attention layers of the Llama shape of
``benchmarks/genai.py`` (8 heads, 2 KV heads, head size 64, float32) fed one new token a step:

- ``concat``: the kit's step graph today: opset-23 ``Attention`` with ``past_key``/``past_value``
  writes a new ``present`` (past + 1 columns) every step;
- ``buffer``: a preallocated cache shared by past and present: ONNX ``TensorScatter`` (opset 24)
  writes the new column in place (past and present bound to one buffer) and ``Attention`` reads
  the whole buffer with the unused columns masked;
- ``gqa``: onnxruntime's ``GroupQueryAttention`` (``com.microsoft``) with its shared buffer, as
  onnxruntime-genai's graphs have it.

Each layout runs ``--steps`` steps from each context length in one process; the median step is
reported (ms) with the ratio concat / layout.

    python benchmarks/kv_cache_layouts.py [--layers 8] [--steps 200] [--lengths 16 128 512 1024 2048]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

HEADS, KV_HEADS, HEAD = 8, 2, 64
LAYOUTS = ("concat", "buffer", "gqa")


def _value(name: str, elem: int, shape) -> object:
    return helper.make_tensor_value_info(name, elem, shape)


def graph(layout: str, layers: int) -> bytes:
    """q (1, 1, heads * 64), k, v (1, 1, kv_heads * 64), mask (1, total) bool, the caches
    ``past_{k,v}{i}`` -> their sum of attention outputs and ``present_{k,v}{i}``."""
    f, i64 = TensorProto.FLOAT, TensorProto.INT64
    inputs = [_value("q", f, [1, 1, HEADS * HEAD]), _value("k", f, [1, 1, KV_HEADS * HEAD]),
              _value("v", f, [1, 1, KV_HEADS * HEAD]), _value("mask", TensorProto.BOOL, [1, "total"])]
    consts = {"kv_shape": [1, 1, KV_HEADS, HEAD], "q_shape": [1, 1, HEADS, HEAD], "one": [1],
              "two": [2], "zero": [0], "zeros3": [0, 0, 0], "out_shape": [1, 1, HEADS * HEAD],
              "mask_shape": [1, 1, 1, -1]}
    inits = [helper.make_tensor(name, i64, [len(v)], v) for name, v in consts.items()]
    nodes = []
    if layout == "gqa":
        inputs += [_value("seqlens", TensorProto.INT32, [1]),
                   _value("total_length", TensorProto.INT32, [])]
    if layout == "buffer":  # heads-first q, k, v; the write index; the mask as (1, 1, 1, total)
        nodes += [helper.make_node("Shape", ["mask"], ["mask_dims"]),
                  helper.make_node("Gather", ["mask_dims", "one"], ["total"], axis=0),
                  helper.make_node("Sub", ["total", "one"], ["write"]),
                  helper.make_node("Reshape", ["mask", "mask_shape"], ["mask4"])]
        for name, shape in (("q", "q_shape"), ("k", "kv_shape"), ("v", "kv_shape")):
            nodes += [helper.make_node("Reshape", [name, shape], [f"{name}_split"]),
                      helper.make_node("Transpose", [f"{name}_split"], [f"{name}4"], perm=[0, 2, 1, 3])]
    outputs, sums = [], []
    for layer in range(layers):
        pk, pv, out = f"past_k{layer}", f"past_v{layer}", f"out{layer}"
        ok, ov = f"present_k{layer}", f"present_v{layer}"
        inputs += [_value(pk, f, [1, KV_HEADS, "cache", HEAD]), _value(pv, f, [1, KV_HEADS, "cache", HEAD])]
        outputs += [_value(ok, f, None), _value(ov, f, None)]
        sums.append(out)
        if layout == "concat":
            nodes.append(helper.make_node("Attention", ["q", "k", "v", "mask", pk, pv], [out, ok, ov],
                                          q_num_heads=HEADS, kv_num_heads=KV_HEADS))
        elif layout == "gqa":
            nodes.append(helper.make_node(
                "GroupQueryAttention", ["q", "k", "v", pk, pv, "seqlens", "total_length"], [out, ok, ov],
                num_heads=HEADS, kv_num_heads=KV_HEADS, domain="com.microsoft"))
        else:
            n = f"_{layer}"
            nodes += [helper.make_node("TensorScatter", [pk, "k4", "write"], [ok]),
                      helper.make_node("TensorScatter", [pv, "v4", "write"], [ov]),
                      helper.make_node("Shape", [ok], ["dims" + n]),
                      helper.make_node("Gather", ["dims" + n, "two"], ["capacity" + n], axis=0),
                      helper.make_node("Sub", ["capacity" + n, "total"], ["unused" + n]),
                      helper.make_node("Concat", ["zeros3", "zero", "zeros3", "unused" + n], ["pads" + n],
                                       axis=0),
                      helper.make_node("Pad", ["mask4", "pads" + n], ["mask_padded" + n]),
                      helper.make_node("Attention", ["q4", ok, ov, "mask_padded" + n], ["heads_out" + n],
                                       q_num_heads=HEADS, kv_num_heads=KV_HEADS),
                      helper.make_node("Transpose", ["heads_out" + n], ["seq_out" + n], perm=[0, 2, 1, 3]),
                      helper.make_node("Reshape", ["seq_out" + n, "out_shape"], [out])]
    nodes.append(helper.make_node("Sum", sums, ["total_out"]))
    body = helper.make_graph(nodes, layout, inputs, [_value("total_out", f, None), *outputs],
                             initializer=inits)
    model = helper.make_model(body, opset_imports=[helper.make_opsetid("", 24),
                                                   helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    return model.SerializeToString()


def step_ms(layout: str, layers: int, length: int, steps: int) -> tuple[float, np.ndarray]:
    """Median ms of one step over ``steps`` steps from a context of ``length`` tokens (the same
    random cache in every layout, zeros after it in a buffer), and every step's output."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(graph(layout, layers), options, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    io = session.io_binding()
    for name, width in (("q", HEADS), ("k", KV_HEADS), ("v", KV_HEADS)):
        io.bind_cpu_input(name, rng.standard_normal((1, 1, width * HEAD), dtype=np.float32))
    out = np.empty((1, 1, HEADS * HEAD), np.float32)
    io.bind_ortvalue_output("total_out", ort.OrtValue.ortvalue_from_numpy(out))
    spare = 0 if layout == "concat" else steps
    columns = ((0, 0), (0, 0), (0, spare), (0, 0))
    cache = [ort.OrtValue.ortvalue_from_numpy(
        np.pad(rng.standard_normal((1, KV_HEADS, length, HEAD), dtype=np.float32), columns))
        for _ in range(2 * layers)]
    past = [f"past_{p}{i}" for i in range(layers) for p in "kv"]
    present = [f"present_{p}{i}" for i in range(layers) for p in "kv"]
    times, outs = [], []
    for step in range(steps):
        total = length + step + 1
        io.bind_cpu_input("mask", np.ones((1, total), bool))
        if layout == "gqa":
            io.bind_cpu_input("seqlens", np.array([total - 1], np.int32))
            io.bind_cpu_input("total_length", np.array(total, np.int32))
        for name, value in zip(past, cache, strict=True):
            io.bind_ortvalue_input(name, value)
        for name, value in zip(present, cache, strict=True):
            if layout == "concat":
                io.bind_output(name, "cpu")
            else:  # one buffer: the op writes the new column in place
                io.bind_ortvalue_output(name, value)
        start = time.perf_counter()
        session.run_with_iobinding(io)
        times.append(time.perf_counter() - start)
        outs.append(out.copy())
        if layout == "concat":
            cache = io.get_outputs()[1:]
    return float(np.median(times[steps // 10:])) * 1e3, np.stack(outs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--lengths", type=int, nargs="+", default=[16, 128, 512, 1024, 2048])
    args = parser.parse_args(argv)
    print(f"| context | {' | '.join(f'{layout} ms' for layout in LAYOUTS)} | concat / buffer "
          "| concat / gqa | outputs' largest difference from concat's |")
    print(f"| ---: | {' | '.join('---:' for _ in LAYOUTS)} | ---: | ---: | ---: |")
    for length in args.lengths:
        runs = {layout: step_ms(layout, args.layers, length, args.steps) for layout in LAYOUTS}
        ms = {layout: run[0] for layout, run in runs.items()}
        difference = max(float(np.abs(runs[layout][1] - runs["concat"][1]).max()) for layout in LAYOUTS)
        print(f"| {length} | {' | '.join(f'{ms[layout]:.3f}' for layout in LAYOUTS)} | "
              f"{ms['concat'] / ms['buffer']:.2f}x | {ms['concat'] / ms['gqa']:.2f}x | {difference:.1e} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
