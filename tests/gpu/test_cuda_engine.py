"""The server's continuous-batching engine on CUDA: eight clients at once, each getting the
tokens ``OnnxModel.generate`` gives its prompt alone on the CPU (float32)."""

from __future__ import annotations

import threading

import numpy as np

from tests.gpu.conftest import TARGET, TARGET_LAYOUT
from transformer_kit.runtime import Engine, OnnxModel


def test_eight_concurrent_clients_each_get_their_tokens_alone(exports):
    _, folder = exports("decoder", "float32")
    on_target, on_cpu = OnnxModel(folder, TARGET, cache_layout=TARGET_LAYOUT), OnnxModel(folder, "cpu")
    rng = np.random.default_rng(5)
    cases = [(rng.integers(3, 96, int(n)), int(m))
             for n, m in zip(rng.integers(1, 20, 8), rng.integers(4, 24, 8), strict=True)]
    results: list = [None] * len(cases)
    with Engine(on_target, max_batch=8) as engine:
        start = threading.Barrier(len(cases))

        def client(i: int) -> None:
            prompt, new = cases[i]
            start.wait()
            results[i] = engine.submit(prompt, max_new_tokens=new).result()

        threads = [threading.Thread(target=client, args=(i,)) for i in range(len(cases))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert engine.stats.max_batch_size > 1  # the clients really ran together
    for (prompt, new), tokens in zip(cases, results, strict=True):
        alone = on_cpu.generate(prompt[None], max_new_tokens=new, attention_mask=np.ones((1, len(prompt))))[0]
        assert 1 <= len(tokens) <= new
        np.testing.assert_array_equal(tokens, alone[:len(tokens)])  # the engine stops at an eos id
