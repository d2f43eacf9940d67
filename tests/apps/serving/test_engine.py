"""The continuous-batching engine: requests that join and leave a running batch get the tokens
``OnnxModel.generate`` gives each alone; cancellation, and a request's time running out, free
its row (or its place in the queue) while the others go on; bounds and bad requests are refused
with a sentence."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from transformer_kit.core.errors import ContextLengthError, InputError
from transformer_kit.runtime import Engine, OnnxModel, QueueFull


def _prompts(count: int, vocab: int, seed: int = 0) -> list[tuple[np.ndarray, int]]:
    rng = np.random.default_rng(seed)
    return [(rng.integers(0, vocab, int(n)), int(m))
            for n, m in zip(rng.integers(1, 12, count), rng.integers(1, 24, count), strict=True)]


def _alone(model: OnnxModel, prompt: np.ndarray, **options) -> np.ndarray:
    return model.generate(prompt[None], attention_mask=np.ones((1, len(prompt))), **options)[0]


def _same_as_alone(tokens: list[int], alone: np.ndarray) -> None:
    """The engine streams up to and including an eos id; generate fills the row after it."""
    assert len(tokens) >= 1
    np.testing.assert_array_equal(tokens, alone[:len(tokens)])


@pytest.fixture(params=["aligned", "shared_buffer"])
def either_model(request, onnx_model, shared_model) -> OnnxModel:
    """The tiny decoder in a left-padded, aligned cache, and one in a shared buffer."""
    return onnx_model if request.param == "aligned" else shared_model


def test_concurrent_greedy_requests_get_the_tokens_of_generate_alone(either_model):
    onnx_model = either_model
    cases = _prompts(12, onnx_model.manifest.src_vocab)
    with Engine(onnx_model, max_batch=5) as engine:
        requests: list = [None] * len(cases)

        def submit(i: int) -> None:
            prompt, new = cases[i]
            requests[i] = engine.submit(prompt, max_new_tokens=new)

        threads = [threading.Thread(target=submit, args=(i,)) for i in range(len(cases))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        results = [request.result() for request in requests]
        assert engine.stats.max_batch_size > 1  # the rows really ran together
        assert engine.stats.max_batch_size <= 5 and engine.stats.requests == len(cases)
    for (prompt, new), tokens, request in zip(cases, results, requests, strict=True):
        _same_as_alone(tokens, _alone(onnx_model, prompt, max_new_tokens=new))
        assert request.finish_reason in ("stop", "length") and request.first_token_s is not None
        assert len(tokens) == new or request.finish_reason == "stop"


def test_sampled_requests_with_a_seed_draw_as_generate_does(onnx_model):
    cases = _prompts(6, onnx_model.manifest.src_vocab, seed=1)
    options = {"do_sample": True, "temperature": 0.9, "top_p": 0.95, "repetition_penalty": 1.2}
    with Engine(onnx_model, max_batch=4) as engine:
        requests = [engine.submit(p, max_new_tokens=n, seed=i, **options)
                    for i, (p, n) in enumerate(cases)]
        results = [request.result() for request in requests]
    for i, ((prompt, new), tokens) in enumerate(zip(cases, results, strict=True)):
        _same_as_alone(tokens, _alone(onnx_model, prompt, max_new_tokens=new, seed=i, **options))


@pytest.mark.parametrize(("invariant", "prefill_tokens", "runs"),
                         [(False, 4096, 1), (False, 24, 3), (True, 4096, 7), (True, 8, 7)])
def test_waiting_requests_are_prefilled_together_and_decode_as_alone(onnx_model, padded_model, invariant,
                                                                     prefill_tokens, runs):
    """Eight requests waiting when the loop starts: without batch invariance prefilled in one
    left-padded run (or, with a small ``prefill_tokens``, in groups of similar length); with it
    (the default) those of one length together (the two of 4 tokens: 7 runs); one ends at its
    first token and leaves its group before the join."""
    onnx_model = onnx_model if invariant else padded_model
    vocab = onnx_model.manifest.src_vocab
    lengths, new = [7, 2, 11, 4, 4, 9, 1, 6], [9, 14, 1, 12, 3, 20, 8, 5]
    prompts = [np.arange(3 * i, 3 * i + n) % vocab for i, n in enumerate(lengths)]
    engine = Engine(onnx_model, max_batch=8, prefill_tokens=prefill_tokens, start=False)
    try:
        requests = [engine.submit(p, max_new_tokens=n) for p, n in zip(prompts, new, strict=True)]
        engine.start()
        results = [request.result() for request in requests]
        assert engine.stats.prefills == runs and engine.stats.max_batch_size == 7
    finally:
        engine.close()
    for prompt, n, tokens in zip(prompts, new, results, strict=True):
        _same_as_alone(tokens, _alone(onnx_model, prompt, max_new_tokens=n))


def test_an_asyncio_reader_gets_every_token_in_order(onnx_model):
    prompt = np.arange(5) % onnx_model.manifest.src_vocab

    async def read(engine: Engine) -> tuple[list[int], int]:
        request = engine.submit(prompt, max_new_tokens=30, min_new_tokens=30)
        arrivals = [tokens async for tokens in request.arrivals()]
        return [t for tokens in arrivals for t in tokens], len(arrivals)

    with Engine(onnx_model) as engine:
        tokens, wakes = asyncio.run(read(engine))
    np.testing.assert_array_equal(tokens, _alone(onnx_model, prompt, max_new_tokens=30, min_new_tokens=30))
    assert 1 <= wakes <= 30


def test_a_cancelled_request_leaves_the_batch_and_the_others_go_on(onnx_model):
    vocab = onnx_model.manifest.src_vocab
    long_prompt, other = np.arange(3) % vocab, np.arange(5) % vocab
    cancelled: dict = {}

    def client_goes_away(new: np.ndarray) -> np.ndarray:
        """Called as each token is chosen: the client leaves after the third."""
        if new.shape[1] == 3:
            cancelled["request"].cancel()
        return np.zeros(len(new), bool)

    engine = Engine(onnx_model, max_batch=4, start=False)
    try:
        cancelled["request"] = engine.submit(long_prompt, max_new_tokens=50, min_new_tokens=3,
                                             stop_matcher=client_goes_away)
        kept = engine.submit(other, max_new_tokens=40, min_new_tokens=40)
        engine.start()
        assert cancelled["request"].result() == cancelled["request"].tokens
        assert cancelled["request"].finish_reason == "cancelled"
        assert len(cancelled["request"].tokens) == 3  # its row left at the next step boundary
        _same_as_alone(kept.result(), _alone(onnx_model, other, max_new_tokens=40, min_new_tokens=40))
        assert len(kept.tokens) == 40
        assert engine.stats.batch_size == 0 and engine.stats.finished == {"cancelled": 1, "length": 1}
    finally:
        engine.close()


def _slowed(engine: Engine, seconds: float) -> Engine:
    """Each decoding step of ``engine`` takes ``seconds`` more (a slow model, for timing)."""
    step = engine.generation.decoder.step

    def slow(tokens):
        time.sleep(seconds)
        return step(tokens)

    engine.generation.decoder.step = slow
    return engine


def test_a_request_past_its_time_leaves_the_batch_and_the_others_go_on(onnx_model):
    vocab = onnx_model.manifest.src_vocab
    timed, other = np.arange(3) % vocab, np.arange(5) % vocab
    engine = _slowed(Engine(onnx_model, max_batch=4, start=False), 0.02)  # 50 steps: over 1 s
    try:
        late = engine.submit(timed, max_new_tokens=50, min_new_tokens=50, timeout=0.3)
        kept = engine.submit(other, max_new_tokens=40, min_new_tokens=40)
        engine.start()
        assert late.result() == late.tokens and late.finish_reason == "timeout"
        assert len(late.tokens) < 50 and "limit of 0.3 s" in late.error
        assert f"after {len(late.tokens)} new tokens" in late.error
        alone = _alone(onnx_model, timed, max_new_tokens=50, min_new_tokens=50)
        np.testing.assert_array_equal(late.tokens, alone[:len(late.tokens)])  # what came was right
        _same_as_alone(kept.result(), _alone(onnx_model, other, max_new_tokens=40, min_new_tokens=40))
        assert len(kept.tokens) == 40
        assert engine.stats.batch_size == 0 and engine.stats.finished == {"timeout": 1, "length": 1}
    finally:
        engine.close()


def test_a_waiting_request_past_its_time_ends_before_its_turn(onnx_model):
    engine = _slowed(Engine(onnx_model, max_batch=1), 0.02)
    try:
        running = engine.submit([1, 2, 3], max_new_tokens=60, min_new_tokens=60)  # the row: over 1.2 s
        start = time.perf_counter()
        waiting = engine.submit([4, 5], max_new_tokens=3, timeout=0.2)
        assert waiting.result() == [] and waiting.finish_reason == "timeout"
        assert time.perf_counter() - start < 0.9, "it waited for the running request's end"
        assert running.finish_reason is None and engine.queue_length == 0  # still decoding
        assert len(running.result()) == 60
        assert engine.stats.finished == {"timeout": 1, "length": 1}
    finally:
        engine.close()


def test_a_full_queue_is_refused_and_the_queued_requests_still_run(onnx_model):
    engine = Engine(onnx_model, max_batch=1, max_queue=2, start=False)
    try:
        first = engine.submit([1, 2, 3], max_new_tokens=3)
        second = engine.submit([4, 5], max_new_tokens=3)
        with pytest.raises(QueueFull, match="holds 2 requests already"):
            engine.submit([6], max_new_tokens=3)
        engine.start()
        assert len(first.result()) == 3 or first.finish_reason == "stop"
        assert second.result() and engine.queue_length == 0
    finally:
        engine.close()


@pytest.mark.parametrize(("prompt", "options", "message"), [
    ([1, 2], {"num_beams": 2}, "one sequence per request"),
    ([1, 2], {"max_new_tokens": -1}, "max_new_tokens"),
    ([1, 2], {"max_new_tokens": 63}, "context length is 64"),
    ([1, 2], {"max_new_tokens": 2, "timeout": 0}, "timeout must be more than 0"),
    ([1, 99], {"max_new_tokens": 2}, "99"),
    ([], {"max_new_tokens": 2}, "non-empty prompt"),
])
def test_bad_requests_are_refused_at_submit_and_the_engine_keeps_serving(onnx_model, prompt, options,
                                                                         message):
    with Engine(onnx_model, max_batch=2) as engine:
        with pytest.raises(InputError, match=message) as refused:
            engine.submit(prompt, **options)
        assert isinstance(refused.value, ContextLengthError) == ("context length" in message)
        assert engine.submit([1, 2, 3], max_new_tokens=2).result()


def test_an_encoder_decoder_export_is_refused_with_a_sentence(tmp_path):
    import torch

    import transformer_kit as tk
    from tests.combinations import tiny_config
    from transformer_kit.export import export_onnx

    torch.manual_seed(0)
    export_onnx(tk.build_model(tiny_config("encoder_decoder")), tmp_path / "onnx")
    with pytest.raises(InputError, match="serves decoders and speech models"):
        Engine(OnnxModel(tmp_path / "onnx", providers="cpu"))


def test_a_failed_prefill_ends_the_requests_it_took_and_the_engine_goes_on(onnx_model):
    """Requests out of the queue but not yet in the batch when their prefill fails end with
    "error" (they do not wait for ever); the next requests are served."""
    engine = Engine(onnx_model, max_batch=4, start=False)
    try:
        taken = [engine.submit(np.arange(1, n), max_new_tokens=3) for n in (4, 6)]

        def broken(*args, **kwargs):
            raise RuntimeError("the prefill broke")

        engine.generation.decoder.prefill = broken  # this batch only: a failure makes a new one
        engine.start()
        waiters = [threading.Thread(target=r.result) for r in taken]
        for waiter in waiters:
            waiter.start()
        for waiter in waiters:
            waiter.join(10)
        assert not any(waiter.is_alive() for waiter in waiters)
        assert [r.finish_reason for r in taken] == ["error", "error"]
        assert "the prefill broke" in taken[0].error
        later = engine.submit(np.arange(1, 5), max_new_tokens=3)
        _same_as_alone(later.result(), _alone(onnx_model, np.arange(1, 5), max_new_tokens=3))
    finally:
        engine.close()


def test_waiting_prompts_sharing_a_chunk_wait_for_one_hit_then_run_together(onnx_model):
    """With batch invariance a cache hit reuses whole 16-token chunks: of six waiting prompts of
    one length sharing their first 20 tokens (a chat template's head) one runs, and the five
    others then continue its first chunk together, in one more run (not one after another)."""
    vocab = onnx_model.manifest.src_vocab
    head = np.arange(20) % vocab
    prompts = [np.concatenate([head, (np.arange(5) + 7 * i) % vocab]) for i in range(6)]
    engine = Engine(onnx_model, max_batch=8, prefix_cache_bytes=10**7, start=False)
    try:
        requests = [engine.submit(p, max_new_tokens=4) for p in prompts]
        engine.start()
        results = [request.result() for request in requests]
        assert engine.stats.prefills == 2 and engine.prefix_cache.hits == 5
        assert sorted(r.cached_tokens for r in requests) == [0] + [16] * 5
    finally:
        engine.close()
    for prompt, tokens in zip(prompts, results, strict=True):
        _same_as_alone(tokens, _alone(onnx_model, prompt, max_new_tokens=4))


def test_the_cache_bound_holds_requests_back_until_rows_leave(either_model):
    """A bound with room for two rows of the longest request: five concurrent requests run at
    most two at a time, each gets the tokens of generate alone, and the cache never passed it."""
    model = either_model
    cases = _prompts(5, model.manifest.src_vocab, seed=3)
    probe = model.batch_decoder()
    columns = max(len(p) + n for p, n in cases)
    bound = probe.cache_bytes(2, columns)
    held = []
    with Engine(model, max_batch=8, max_cache_bytes=bound) as engine:
        step = engine.generation.step

        def watched(*args):
            step(*args)
            held.append(engine.generation.decoder.nbytes)
        engine.generation.step = watched
        requests = [engine.submit(p, max_new_tokens=n) for p, n in cases]
        results = [request.result() for request in requests]
        assert engine.stats.max_batch_size == 2
        assert engine.cache_bytes[1] == bound
    assert max(held) <= bound
    for (prompt, new), tokens in zip(cases, results, strict=True):
        _same_as_alone(tokens, _alone(model, prompt, max_new_tokens=new))


def test_a_request_whose_cache_alone_passes_the_bound_is_refused(either_model):
    """The bound admits a row of 15 columns; one of 40 (a shared buffer: 110, its width
    growing by 64 columns) is refused at submit, and the engine goes on."""
    model = either_model
    bound = model.batch_decoder().cache_bytes(1, 15)
    new = 100 if model.step_name == "decoder_step_shared" else 30
    with Engine(model, max_cache_bytes=bound) as engine:
        with pytest.raises(InputError, match=r"cache may take .* MiB .*more than the engine's bound"):
            engine.submit(np.arange(1, 11), max_new_tokens=new)
        assert engine.submit(np.arange(1, 11), max_new_tokens=5).result()  # it goes on serving
    with pytest.raises(InputError, match="max_cache_bytes must be at least 1"):
        Engine(model, max_cache_bytes=0)
