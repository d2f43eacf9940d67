"""Optional offline graph optimization with onnxruntime, kept only when it verifies and pays.

onnxruntime optimizes every graph again when a session is created, so the offline pass can
save load time and may or may not change run time: both are measured here, on the same
inputs in the same process, and reported.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from transformer_kit.core.decoding.prompts import real_from_pad
from transformer_kit.export.verify import random_ids, verify_export
from transformer_kit.export.weights import share_weights
from transformer_kit.runtime.manifest import Manifest
from transformer_kit.runtime.onnx_model import OnnxModel
from transformer_kit.runtime.providers import CPU


def _load_and_time(path: Path, feeds: dict, runs: int) -> tuple[float, float]:
    start = time.perf_counter()
    session = ort.InferenceSession(str(path), providers=[CPU])
    load = time.perf_counter() - start
    session.run(None, feeds)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - start)
    return load, statistics.median(times)


def _forward_feeds(manifest: Manifest) -> dict[str, np.ndarray]:
    length = min(32, manifest.max_positions or 32)
    graph = manifest.graphs["model"]
    names = [n for n in graph.inputs if n != "attention_mask"]
    vocabs = [manifest.src_vocab, manifest.tgt_vocab]
    feeds = {name: random_ids(4, length, vocab, manifest.pad_id, seed=i).numpy()
             for i, (name, vocab) in enumerate(zip(names, vocabs, strict=False))}
    if "attention_mask" in graph.inputs:
        feeds["attention_mask"] = real_from_pad(feeds[names[0]], manifest.pad_id).astype(np.int64)
    return feeds


def optimize_graphs(model, folder: Path, manifest: Manifest, tolerance: float | None,
                    runs: int = 20) -> dict:
    """Write onnxruntime's extended-level optimized graphs; keep them if they verify and the
    forward graph's median latency is no worse than 5 % above the original's."""
    originals = {}
    for name, graph in manifest.graphs.items():
        source = folder / graph.file
        optimized = folder / f"{name}.optimized.onnx"
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        options.optimized_model_filepath = str(optimized)
        ort.InferenceSession(str(source), options, providers=[CPU])
        originals[name] = source.with_suffix(".original.onnx")
        source.rename(originals[name])
        optimized.rename(source)
    feeds = _forward_feeds(manifest)
    model_file = folder / manifest.graphs["model"].file
    load_before, run_before = _load_and_time(originals["model"], feeds, runs)
    load_after, run_after = _load_and_time(model_file, feeds, runs)
    nodes = {name: (len(onnx.load(str(originals[name]), load_external_data=False).graph.node),
                    len(onnx.load(str(folder / g.file), load_external_data=False).graph.node))
             for name, g in manifest.graphs.items()}
    verified, reason = True, ""
    try:
        verify_export(model, OnnxModel(folder, providers="cpu"), tolerance)
    except Exception as exc:
        verified, reason = False, str(exc)
    kept = verified and run_after <= 1.05 * run_before
    for name, original in originals.items():
        if kept:
            original.unlink()
        else:
            original.replace(folder / manifest.graphs[name].file)
    if kept:
        manifest.optimized_for = CPU
    share_weights(folder, [g.file for g in manifest.graphs.values()])  # the optimizer inlines them
    return {
        "kept": kept,
        "verified": verified,
        **({"verify_error": reason} if reason else {}),
        "forward_ms": {"original": run_before * 1e3, "optimized": run_after * 1e3},
        "load_s": {"original": load_before, "optimized": load_after},
        "nodes": {name: {"original": a, "optimized": b} for name, (a, b) in nodes.items()},
        "forward_input": {k: list(v.shape) for k, v in feeds.items()},
    }
