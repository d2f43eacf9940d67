"""Prompt lookup in the serving engine: a request that asks for it gets the tokens
``OnnxModel.generate`` gives it (greedy, and sampled with a seed), its drafts checked while it
decodes alone; with other requests in the batch it decodes plainly and they are all exact."""

from __future__ import annotations

import re
import threading

import httpx
import numpy as np
import pytest

from transformer_kit.core.errors import InputError
from transformer_kit.runtime import Engine, OnnxModel

#: Prompts that repeat themselves: prompt lookup drafts from the first token on.
REPEATING = [[5, 9, 12, 7, 5, 9, 12, 7, 5, 9, 12], [30, 31, 32, 33, 34, 30, 31, 32, 33, 34, 30, 31]]


def _alone(model: OnnxModel, prompt: list[int], **options) -> list[int]:
    ids = np.array([prompt])
    return model.generate(ids, attention_mask=np.ones_like(ids), **options)[0].tolist()


@pytest.mark.parametrize("options", [{}, {"do_sample": True, "seed": 5, "temperature": 0.02}],
                         ids=["greedy", "sampled"])  # sampled: peaked, so drafts can stand
def test_a_request_alone_checks_drafts_and_gets_the_tokens_of_generate(onnx_model, options):
    with Engine(onnx_model) as engine:
        for prompt in REPEATING:
            tokens = engine.submit(prompt, max_new_tokens=24, prompt_lookup_num_tokens=5, **options).result()
            expected = _alone(onnx_model, prompt, max_new_tokens=24, prompt_lookup_num_tokens=5, **options)
            assert tokens == expected[:len(tokens)] and len(tokens) >= 1
            if not options:  # greedy: plain greedy's tokens too
                assert tokens == _alone(onnx_model, prompt, max_new_tokens=24)[:len(tokens)]
        stats = engine.stats
    assert stats.drafted_tokens > 0 and stats.accepted_tokens > 0
    assert stats.steps < stats.generated_tokens  # accepted drafts: more tokens than steps


def test_with_other_requests_in_the_batch_every_request_is_exact(onnx_model):
    prompts = REPEATING * 3
    with Engine(onnx_model, max_batch=4) as engine:
        requests: list = [None] * len(prompts)

        def submit(i: int) -> None:
            lookup = {"prompt_lookup_num_tokens": 4} if i % 2 == 0 else {}
            requests[i] = engine.submit(prompts[i], max_new_tokens=20, **lookup)

        threads = [threading.Thread(target=submit, args=(i,)) for i in range(len(prompts))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        results = [request.result() for request in requests]
        assert engine.stats.max_batch_size > 1
    for prompt, tokens in zip(prompts, results, strict=True):
        assert tokens == _alone(onnx_model, prompt, max_new_tokens=20)[:len(tokens)]


def test_an_export_without_several_positions_logits_refuses_prompt_lookup(onnx_model):
    with Engine(onnx_model) as engine:
        engine.generation.decoder.verifies = False  # as an export made before logit_positions
        with pytest.raises(InputError, match="export the model again"):
            engine.submit(REPEATING[0], max_new_tokens=4, prompt_lookup_num_tokens=3)
        assert engine.submit(REPEATING[0], max_new_tokens=4).result()  # and it goes on serving


def test_the_openai_client_asks_for_prompt_lookup_in_extra_body(onnx_model):
    import openai

    from transformer_kit.apps.serving.http import create_app
    from transformer_kit.apps.serving.http import serve_in_thread as running

    prompt = REPEATING[1]  # the tiny model's greedy reply copies from it
    plain = _alone(onnx_model, prompt, max_new_tokens=16)
    with Engine(onnx_model) as engine, running(create_app(engine, "tiny")) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
        lookup = {"prompt_lookup_num_tokens": 6}
        completion = client.completions.create(model="tiny", prompt=prompt, max_tokens=16, temperature=0,
                                               extra_body=lookup)
        tokens = completion.choices[0].model_extra["token_ids"]
        assert tokens == plain[:len(tokens)]
        streamed = []
        for chunk in client.completions.create(model="tiny", prompt=prompt, max_tokens=16, temperature=0,
                                               stream=True, extra_body=lookup):
            streamed += chunk.choices[0].model_extra["token_ids"]
        assert streamed == tokens
        assert engine.stats.accepted_tokens > 0, (tokens, engine.stats)
        metrics = httpx.get(f"{url}/metrics").text
        for name in ("drafted", "accepted"):
            found = re.search(rf"^transformer_kit_{name}_tokens_total (\S+)$", metrics, re.M)
            assert float(found.group(1)) == getattr(engine.stats, f"{name}_tokens") > 0
        with pytest.raises(openai.BadRequestError, match="prompt_lookup_num_tokens"):
            client.completions.create(model="tiny", prompt=prompt, max_tokens=4,
                                      extra_body={"prompt_lookup_num_tokens": 0})
        again = client.completions.create(model="tiny", prompt=prompt, max_tokens=16, temperature=0)
        assert again.choices[0].model_extra["token_ids"] == tokens


def test_an_engine_default_drafts_for_requests_that_set_none(onnx_model):
    """``Engine(prompt_lookup_num_tokens=...)`` (``serve --prompt-lookup-num-tokens``): a request
    without the option drafts too, and gets plain greedy's tokens."""
    with Engine(onnx_model, prompt_lookup_num_tokens=5) as engine:
        for prompt in REPEATING:
            tokens = engine.submit(prompt, max_new_tokens=24).result()
            assert tokens == _alone(onnx_model, prompt, max_new_tokens=24)[:len(tokens)] and tokens
        stats = engine.stats
    assert stats.drafted_tokens > 0 and stats.accepted_tokens > 0
    with Engine(onnx_model) as engine:  # no default: a request without the option drafts nothing
        engine.submit(REPEATING[0], max_new_tokens=24).result()
        assert engine.stats.drafted_tokens == 0


@pytest.mark.parametrize("count", [0, 65, 2.5, True])
def test_an_engine_default_out_of_range_is_refused(onnx_model, count):
    with pytest.raises(InputError, match=r"1\.\.64 drafted tokens"):
        Engine(onnx_model, prompt_lookup_num_tokens=count, start=False)


def test_an_engine_default_on_an_export_that_cannot_check_drafts_is_refused(onnx_model):
    from transformer_kit.runtime.speculation import default_lookup

    batch = onnx_model.batch_decoder()
    assert default_lookup(4, batch) == 4 and default_lookup(None, batch) is None
    batch.verifies = False  # as an export made before logit_positions
    with pytest.raises(InputError, match="export the model again"):
        default_lookup(4, batch)
