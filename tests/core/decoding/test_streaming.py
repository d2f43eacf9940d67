"""Streaming yields the tokens ``generate`` returns, one step at a time, in both runtimes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import transformer_kit as tk

STRATEGIES = {
    "greedy": {},
    "sampling": {"do_sample": True, "top_p": 0.9, "seed": 7, "num_return_sequences": 2},
    "eos": {"eos_id": [5, 9, 17]},
}


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_stream_yields_the_generated_tokens_step_by_step(runtimes, prompts, name):
    model, onnx_model = runtimes
    options = STRATEGIES[name]
    expected = model.generate(prompts, 12, **options).numpy()
    pytorch_steps = list(model.stream(prompts, 12, **options))
    assert all(isinstance(step, torch.Tensor) and step.shape == (len(expected),)
               for step in pytorch_steps)
    np.testing.assert_array_equal(np.stack([s.numpy() for s in pytorch_steps], 1), expected)
    onnx_steps = list(onnx_model.stream(prompts.numpy(), 12, **options))
    np.testing.assert_array_equal(np.stack(onnx_steps, 1), expected)


def test_a_stream_can_be_abandoned_and_leaves_the_model_as_it_was(runtimes, prompts):
    model, onnx_model = runtimes
    expected = model.generate(prompts, 6).numpy()
    stream = onnx_model.stream(prompts.numpy(), 50)  # a long budget, stopped by the caller
    first = [next(stream) for _ in range(6)]
    stream.close()
    np.testing.assert_array_equal(np.stack(first, 1), expected)
    model.train()  # dropout would change tokens: each step runs in eval mode, then back
    try:
        pytorch_stream = model.stream(prompts, 50)
        steps = [next(pytorch_stream).numpy() for _ in range(6)]
        assert model.training
        pytorch_stream.close()
    finally:
        model.eval()
    np.testing.assert_array_equal(np.stack(steps, 1), expected)


def test_stream_checks_the_call_at_once(runtimes, prompts):
    model, onnx_model = runtimes
    for call in (lambda: model.stream(prompts, 10**9), lambda: onnx_model.stream(prompts, 10**9)):
        with pytest.raises(tk.InputError, match="context length is 64"):
            call()  # not at the first next()
