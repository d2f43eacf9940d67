"""Generation speed of a model in PyTorch eager (the baseline) and in onnxruntime, one run."""

from __future__ import annotations

import statistics
import time

import numpy as np
import torch


def _median_seconds(fn, repeats: int) -> tuple[float, object]:
    result = fn()  # warm-up (allocations, onnxruntime's first-run work)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def generation_speed(model, om, batch: int, prompt_len: int, new_tokens: int,
                     repeats: int = 3) -> list[dict]:
    """Tokens per second of greedy generation with eos disabled by the budget: rows run the
    full ``new_tokens`` unless the model emits eos (then fewer tokens are counted)."""
    cfg = model.config
    vocab = cfg.src_vocab
    special = {i for i in (cfg.pad_id, cfg.bos_id, cfg.eos_id) if i is not None}
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (batch, prompt_len), generator=gen)
    for token in special:
        ids[ids == token] = max(special) + 1 if max(special) + 1 < vocab else 0
    rows = []
    with torch.inference_mode():
        seconds, tokens = _median_seconds(lambda: model.generate(ids, max_new_tokens=new_tokens),
                                          repeats)
    count = int(tokens.numel())
    rows.append({"runtime": "PyTorch eager (cached)", "seconds": seconds,
                 "tokens_per_s": count / seconds, "ms_per_token": 1e3 * seconds / max(count, 1)})
    ids_np = ids.numpy().astype(np.int64)
    seconds, tokens = _median_seconds(lambda: om.generate(ids_np, max_new_tokens=new_tokens), repeats)
    count = int(tokens.size)
    rows.append({"runtime": f"onnxruntime ({om.provider})", "seconds": seconds,
                 "tokens_per_s": count / seconds, "ms_per_token": 1e3 * seconds / max(count, 1)})
    return rows
