"""Speed measurements, each against a baseline timed in the same run.

The machine is shared and its speed drifts by tens of percent over minutes, so runners are
timed in interleaved rounds (one call of each per round) and every ratio is taken within a
round, then the median over rounds is reported. Hardware limits are probed the same way:

- :func:`read_bandwidth_probe`: GB/s of onnxruntime's matrix-vector product over a 256 MB
  float32 matrix (far beyond any cache), the fastest way found here to stream memory; decoding
  one token must read every weight once, so ``bandwidth / weight_bytes_per_token`` bounds
  tokens per second at batch 1.
- :func:`matmul_peak_probe`: the best GFLOP/s of onnxruntime's float32 MatMul over a few large
  shapes, a compute bound.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

BANDWIDTH_SHAPE = (4096, 16384)  # 256 MB of float32 weights
PEAK_SIZE = 1024


@dataclass
class Runner:
    """One thing to time: ``run()`` does the work once and returns how many tokens it made
    (or 0 when only latency matters)."""

    name: str
    run: Callable[[], Any]
    tokens: Callable[[Any], int] = lambda result: 0
    note: str = ""


@dataclass
class Timing:
    name: str
    seconds: list[float] = field(default_factory=list)
    tokens: int = 0
    note: str = ""
    result: Any = None

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.median if self.tokens else float("nan")


def interleaved(runners: list[Runner], rounds: int, probes: dict[str, Callable[[], float]] | None = None,
                progress: Callable[[str], None] | None = None,
                settle: bool = False) -> tuple[list[Timing], dict[str, list[float]]]:
    """Time each runner once per round, in turn, after one warm-up call each. The order
    rotates from round to round, so no runner always follows the same one (a runner timed
    right after another runtime runs slower, whichever it is).

    With ``settle``, each timed call follows an untimed call of the same runner, so that the
    worker threads a previous runtime leaves spinning (onnxruntime's and PyTorch's both do)
    and cold allocator state do not land on the timed call; use it for short calls.

    Returns the timings (seconds per round, tokens of the last call, its result) and each
    probe's value per round (probes run at the start of every round).
    """
    timings = [Timing(r.name, note=r.note) for r in runners]
    probe_values: dict[str, list[float]] = {name: [] for name in probes or {}}
    pairs = list(zip(runners, timings, strict=True))
    for runner, timing in pairs:
        if progress:
            progress(f"warm-up: {runner.name}")
        timing.result = runner.run()
        timing.tokens = runner.tokens(timing.result)
    for index in range(rounds):
        if progress:
            progress(f"round {index + 1}/{rounds}")
        for name, probe in (probes or {}).items():
            probe_values[name].append(probe())
        shift = index % len(runners)
        for runner, timing in [*pairs[shift:], *pairs[:shift]]:
            if settle:
                runner.run()
            start = time.perf_counter()
            runner.run()
            timing.seconds.append(time.perf_counter() - start)
    return timings, probe_values


def folder_bytes(folder: Path) -> int:
    """Bytes of an export folder's graphs and their weights (tokenizer and config files left
    out), a transformer-kit or an onnxruntime-genai one."""
    return sum(p.stat().st_size for p in folder.iterdir() if p.suffix in (".onnx", ".data"))


def ratio_to(timings: list[Timing], baseline: str, other: str) -> float:
    """Median over rounds of baseline_seconds / other_seconds (>1: ``other`` is faster)."""
    by_name = {t.name: t for t in timings}
    base, test = by_name[baseline].seconds, by_name[other].seconds
    return statistics.median(b / t for b, t in zip(base, test, strict=True))


# -- hardware probes -------------------------------------------------------------------------
def matmul_session(products: list[tuple[int, int]], rows: int = 1, threads: int | None = None):
    """An onnxruntime CPU session holding one MatMul per (in, out) product, each on an input of
    ``rows`` rows (one input per distinct width) and a random float32 weight, and its feeds."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits, inputs, outputs = [], [], {}, []
    for index, (k, n) in enumerate(products):
        name = f"x{k}"
        if name not in inputs:
            inputs[name] = helper.make_tensor_value_info(name, TensorProto.FLOAT, [rows, k])
        inits.append(numpy_helper.from_array(rng.standard_normal((k, n), dtype=np.float32), f"w{index}"))
        nodes.append(helper.make_node("MatMul", [name, f"w{index}"], [f"y{index}"]))
        outputs.append(helper.make_tensor_value_info(f"y{index}", TensorProto.FLOAT, [rows, n]))
    graph = helper.make_graph(nodes, "matmuls", list(inputs.values()), outputs, inits)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = min(proto.ir_version, 9)
    onnx.checker.check_model(proto)
    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    session = ort.InferenceSession(proto.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    feeds = {name: rng.standard_normal((rows, int(name[1:])), dtype=np.float32) for name in inputs}
    return session, feeds


def median_time(fn: Callable[[], Any], calls: int) -> float:
    """Median seconds of ``calls`` calls of ``fn`` after one untimed call."""
    fn()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def read_bandwidth_probe(threads: int | None = None, calls: int = 15) -> Callable[[], float]:
    """A function returning the measured read bandwidth in bytes/s (see the module docstring)."""
    k, n = BANDWIDTH_SHAPE
    session, feeds = matmul_session([(k, n)], 1, threads)
    return lambda: k * n * 4 / median_time(lambda: session.run(None, feeds), calls)


def matmul_peak_probe(threads: int | None = None, calls: int = 5) -> Callable[[], float]:
    """A function returning onnxruntime's float32 MatMul throughput in FLOP/s: the best of
    a square 1024^3 product and the shapes a Transformer layer and head use (M = 512 or 256
    rows against 512 x 2048 and 512 x 16384 weights)."""
    shapes = [(PEAK_SIZE, PEAK_SIZE, PEAK_SIZE), (512, 512, 2048), (256, 512, 16384)]
    sessions = [(m * k * n, *matmul_session([(k, n)], m, threads)) for m, k, n in shapes]
    return lambda: max(2 * size / median_time(lambda s=session, f=feeds: s.run(None, f), calls)
                       for size, session, feeds in sessions)


def weight_products(model: torch.nn.Module) -> list[tuple[int, int]]:
    """(in, out) of every matrix product a decoding step runs: each linear layer of the decoder
    (a self-attention's q, k and v as one product, as the export fuses them) and the head."""
    from transformer_kit.core.attention import MultiHeadAttention

    shapes = []
    fused = set()
    for module in model.decoder.modules():
        if isinstance(module, MultiHeadAttention) and not module.is_cross:
            projections = (module.q_proj, module.k_proj, module.v_proj)
            shapes.append((module.q_proj.in_features, sum(p.out_features for p in projections)))
            fused.update(id(p) for p in projections)
        elif isinstance(module, torch.nn.Linear) and id(module) not in fused:
            shapes.append((module.in_features, module.out_features))
    shapes.append((model.head.in_features, model.head.out_features))
    return shapes


def weight_stream_runner(model: torch.nn.Module, steps: int, threads: int | None = None) -> Runner:
    """The ceiling of a per-operator runtime: an onnxruntime graph holding only the step's
    matrix products (batch 1, same shapes, float32), run ``steps`` times. Its tokens/s is what
    generation would reach if nothing but the weight reads cost time."""
    session, feeds = matmul_session(weight_products(model), 1, threads)

    def run():
        for _ in range(steps):
            session.run(None, feeds)
        return steps

    return Runner("matrix products alone (ceiling)", run, lambda count: count,
                  note="onnxruntime, no other operator, no Python loop")


# -- model accounting ------------------------------------------------------------------------
def weight_bytes_per_token(model: torch.nn.Module) -> int:
    """Bytes of weights a decoder reads to produce one token at batch 1: every parameter of
    the decoder layers, final norm and output projection, once (a tied projection counts
    once, as the head); embedding tables are read one row at a time and not counted."""
    decoder = model.decoder
    params = {id(p): p for p in decoder.parameters()}
    params.update({id(p): p for p in model.head.parameters()})
    return sum(p.numel() * p.element_size() for p in params.values())


def forward_flops(model: torch.nn.Module, *inputs: torch.Tensor) -> int:
    """Floating-point operations of one forward call, counted by torch's FlopCounterMode."""
    from torch.utils.flop_counter import FlopCounterMode

    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        model(*inputs)
    return counter.get_total_flops()


def random_prompts(vocab: int, batch: int, length: int, avoid: set[int], seed: int = 0) -> torch.Tensor:
    """(batch, length) int64 ids drawn uniformly, none of them in ``avoid`` (pad/bos/eos)."""
    gen = torch.Generator().manual_seed(seed)
    allowed = torch.tensor([i for i in range(min(vocab, 65536)) if i not in avoid])
    return allowed[torch.randint(0, len(allowed), (batch, length), generator=gen)]


# -- runners -----------------------------------------------------------------------------------
def kit_generation_runners(model, om, ids: torch.Tensor, new_tokens: int) -> list[Runner]:
    """PyTorch eager (cached) and onnxruntime greedy generation of the same prompts."""
    ids_np = ids.numpy().astype(np.int64)

    def eager():
        with torch.inference_mode():
            return model.generate(ids, max_new_tokens=new_tokens)

    return [
        Runner("transformer-kit, PyTorch eager", eager, lambda out: int(out.numel())),
        Runner(onnx_runner_name(om), lambda: om.generate(ids_np, max_new_tokens=new_tokens),
               lambda out: int(out.size)),
    ]


def onnx_runner_name(om) -> str:
    """'transformer-kit, onnxruntime (CPU)': the row name of an OnnxModel, with its provider."""
    return f"transformer-kit, onnxruntime ({om.provider.replace('ExecutionProvider', '')})"


def exported(model: torch.nn.Module, folder: Path, providers: str = "auto", **export_options):
    """An OnnxModel of ``model`` in ``folder``, exported (report on stderr) unless an earlier
    export with the same quantization is already there, so repeated benchmark runs in one
    workdir reuse it."""
    import sys

    from transformer_kit.runtime import OnnxModel

    report = export_unless_current(model, folder, **export_options)
    if report is not None:
        print(report, file=sys.stderr)
    return OnnxModel(folder, providers)


def export_unless_current(model: torch.nn.Module, folder: Path, **export_options):
    """``export_onnx(model, folder, **export_options)`` unless ``folder`` holds an export with
    the same quantization and dtype (:func:`export_is_current`; another one is removed first):
    the export's report, or None when the folder was reused."""
    import shutil

    from transformer_kit.export import export_onnx

    if export_is_current(folder, export_options.get("quantize"), export_options.get("dtype", "float32")):
        return None
    shutil.rmtree(folder, ignore_errors=True)
    return export_onnx(model, folder, **export_options)


def export_is_current(folder: Path, quantize: Any = None, dtype: str = "float32") -> bool:
    """Whether ``folder`` holds an export made with ``quantize`` (an ``Int4``'s options, or its
    absence) in ``dtype``, so a benchmark's workdir never reuses an export made with another
    version's defaults (an ``Int4()`` of an older kit) or in another precision."""
    import json

    from transformer_kit.export.quantize import Int4, method, quantization

    manifest = folder / "manifest.json"
    if not manifest.exists():
        return False
    quantize = quantization(quantize)  # "int4" -> Int4()
    made = json.loads(manifest.read_text())
    wanted = json.loads(json.dumps(quantize.describe() if isinstance(quantize, Int4) else {}, default=str))
    return (made.get("quantization") == method(quantize) and made.get("quantization_options", {}) == wanted
            and made.get("dtype") == dtype)
