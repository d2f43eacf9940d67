"""Log probability reports (core/decoding/logprobs.py) against torch's ``log_softmax`` and
``topk`` on random scores, and ``generate``'s reports against the PyTorch model's own forward."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from transformer_kit.core.decoding.logprobs import log_softmax, pick, prompt_logprobs, top_indices
from transformer_kit.core.errors import InputError


def test_log_softmax_and_top_equal_torch():
    rng = np.random.default_rng(0)
    scores = (rng.standard_normal((7, 1000)) * 4).astype(np.float32)
    scores[2, :500] = -np.inf  # a processor's mask
    ours = log_softmax(scores)
    reference = torch.log_softmax(torch.from_numpy(scores), dim=-1).numpy()
    np.testing.assert_allclose(ours, reference, atol=1e-5)
    for k in (0, 1, 5, 20, 400):
        np.testing.assert_array_equal(top_indices(ours, k), torch.topk(torch.from_numpy(ours), k).indices)


def test_pick_reports_the_token_its_rank_and_the_most_likely():
    logprobs = log_softmax(np.array([[0.0, 3.0, 1.0, 3.0, -1.0]], np.float32))
    report = pick(logprobs, np.array([2]), 3)[0]
    assert report.token_id == 2 and report.rank == 3
    assert report.logprob == pytest.approx(float(logprobs[0, 2]))
    assert [i for i, _ in report.top] == [1, 3, 2]  # a tie: the lower id first


def test_prompt_logprobs_are_each_positions_log_softmax_at_the_next_token():
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((600, 50)).astype(np.float32)  # over several chunks
    prompt = rng.integers(0, 50, 600)
    reports = prompt_logprobs(logits, prompt, 2)
    assert reports[0] is None and len(reports) == 600
    reference = torch.log_softmax(torch.from_numpy(logits[:-1]), -1).numpy()
    np.testing.assert_allclose([r.logprob for r in reports[1:]],
                               reference[np.arange(599), prompt[1:]], atol=1e-5)


@pytest.mark.parametrize("options", [{}, {"do_sample": True, "seed": 4, "temperature": 0.7}])
def test_generate_reports_the_models_log_softmax(runtimes, prompts, options):
    """Raw reports are the PyTorch model's log-softmax at each new token (both runtimes), the
    chosen token first among the alternatives when greedy; a row's reports end with it."""
    model, om = runtimes
    for runtime in (model, om):
        tokens, reports = runtime.generate(prompts, max_new_tokens=6, logprobs=4, **options)
        tokens = np.asarray(tokens)
        for row, (prompt, new) in enumerate(zip(prompts, tokens, strict=True)):
            real = prompt[prompt != 0]
            ended = [i for i, t in enumerate(new.tolist()) if t == 2]
            length = ended[0] + 1 if ended else len(new)
            assert len(reports[row]) == length
            full = torch.cat([real, torch.from_numpy(new[:length - 1])])[None]
            with torch.no_grad():
                logits = model(full, attention_mask=torch.ones_like(full))  # a new 0 is a token
                expected = torch.log_softmax(logits[0, len(real) - 1:].float(), -1).numpy()
            np.testing.assert_allclose([r.logprob for r in reports[row]],
                                       expected[np.arange(length), new[:length]], atol=1e-4)
            for step, report in enumerate(reports[row]):
                assert [i for i, _ in report.top] == np.argsort(-expected[step], kind="stable")[:4].tolist()
                if not options:
                    assert report.top[0][0] == report.token_id and report.rank == 1


def test_processed_reports_are_of_the_scores_sampled_from(runtimes, prompts):
    model, _ = runtimes
    _, raw = model.generate(prompts[:1], max_new_tokens=3, logprobs=0, do_sample=True, seed=1,
                            temperature=0.5)
    _, processed = model.generate(prompts[:1], max_new_tokens=3, logprobs=0, do_sample=True, seed=1,
                                  temperature=0.5, logprobs_mode="processed")
    assert [r.token_id for r in raw[0]] == [r.token_id for r in processed[0]]
    assert all(p.logprob > r.logprob or p.rank == 1 for r, p in zip(raw[0], processed[0], strict=True))


def test_logprobs_refused_with_beams_and_out_of_bounds(runtimes, prompts):
    _, om = runtimes
    with pytest.raises(InputError, match="beam search"):
        om.generate(prompts, max_new_tokens=2, num_beams=2, logprobs=1)
    with pytest.raises(InputError, match="logprobs"):
        om.generate(prompts, max_new_tokens=2, logprobs=21)
