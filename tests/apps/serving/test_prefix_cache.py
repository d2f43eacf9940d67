"""The engine's prefix cache: a prompt that starts with a cached prompt's tokens prefills only
the rest and still gets exactly the greedy tokens of ``OnnxModel.generate`` and of an engine
without a cache; entries are bounded by bytes, least recently used out first.

The cache's mechanics at the granularity of single tokens, on the export without batch
invariance (``onnx_model`` here; a batch-invariant one reuses whole 16-token chunks:
tests/runtime/test_batch_invariance.py and test_prefix_cache_http.py)."""

from __future__ import annotations

import numpy as np
import pytest

from transformer_kit.core.errors import InputError
from transformer_kit.runtime import Engine, OnnxModel
from transformer_kit.runtime.prefix_cache import BLOCK, block_keys


@pytest.fixture(scope="module")
def onnx_model(padded_model):
    return padded_model

NEW = 10  # new tokens per request: prompts of up to 50 tokens fit the tiny model's 64 positions


def _prefix(vocab: int, length: int = 40, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(3, vocab, length)


def _endings(vocab: int, count: int, seed: int = 1) -> list[np.ndarray]:
    """Distinct endings of 2 to 6 tokens, each starting with a token of its own (so a prompt's
    cached prefix is exactly the shared one)."""
    rng = np.random.default_rng(seed)
    return [np.concatenate([[3 + i], rng.integers(3, vocab, int(rng.integers(1, 6)))])
            for i in range(count)]


def _alone(model, prompt: np.ndarray) -> list[int]:
    return model.generate(prompt[None], attention_mask=np.ones((1, len(prompt))),
                          max_new_tokens=NEW)[0].tolist()


def _run(engine: Engine, prompts: list[np.ndarray]) -> list[list[int]]:
    """Each prompt submitted after the one before it ended; their tokens."""
    return [engine.submit(p, max_new_tokens=NEW).result() for p in prompts]


def _same(tokens: list[int], expected: list[int]) -> None:
    """The engine streams up to and including an eos id; generate fills the row after it."""
    assert len(tokens) >= 1 and tokens == expected[:len(tokens)]


def test_prompts_sharing_a_long_prefix_prefill_only_their_endings_with_the_tokens_of_generate(onnx_model):
    vocab = onnx_model.manifest.src_vocab
    prefix = _prefix(vocab)
    prompts = [np.concatenate([prefix, ending]) for ending in _endings(vocab, 4)]
    with Engine(onnx_model, prefix_cache_bytes=10**7) as engine:
        cached = _run(engine, prompts)
        requests = [engine.submit(p, max_new_tokens=NEW) for p in prompts[:1]]
        requests[0].result()
        stats, cache = engine.stats, engine.prefix_cache
    with Engine(onnx_model) as plain:
        uncached = _run(plain, prompts)
        assert plain.prefix_cache is None
    for prompt, tokens, without in zip(prompts, cached, uncached, strict=True):
        assert tokens == without
        _same(tokens, _alone(onnx_model, prompt))
    assert (cache.hits, cache.misses) == (4, 1)  # the first prompt missed; the others continued it
    assert cache.reused_tokens == 3 * len(prefix) + len(prompts[0]) - 1
    assert requests[0].cached_tokens == len(prompts[0]) - 1 and stats.prefills == 5
    assert len(cache) == 4 and cache.nbytes == sum(e.nbytes for e in cache.entries.values())


def test_a_prompt_equal_to_a_cached_one_still_computes_its_last_token(onnx_model):
    prompt = _prefix(onnx_model.manifest.src_vocab, 2 * BLOCK)
    with Engine(onnx_model, prefix_cache_bytes=10**7) as engine:
        first = engine.submit(prompt, max_new_tokens=NEW)
        second = engine.submit(prompt, max_new_tokens=NEW)  # queued: admitted after the first ran
        tokens = [first.result(), second.result()]
        third = engine.submit(prompt, max_new_tokens=NEW)
        tokens.append(third.result())
        assert len(engine.prefix_cache) == 1  # the same tokens: one entry
    assert [r.cached_tokens for r in (first, second, third)] == [0, len(prompt) - 1, len(prompt) - 1]
    expected = _alone(onnx_model, prompt)
    for got in tokens:
        _same(got, expected)


@pytest.mark.parametrize("length", [BLOCK, BLOCK + 1, 2 * BLOCK])
def test_a_prompt_asked_again_keeps_one_entry_when_hits_are_whole_chunks(exported, length):
    """A batch-invariant export reuses whole 16-token chunks: a one-chunk prompt's entry is no
    hit for the same prompt (its one chunk holds the last token), yet it is the same entry."""
    invariant = OnnxModel(exported[1] / "onnx", providers="cpu")
    prompt = _prefix(invariant.manifest.src_vocab, length)
    with Engine(invariant, prefix_cache_bytes=10**7) as engine:
        requests = [engine.submit(prompt, max_new_tokens=NEW) for _ in range(3)]
        tokens = [r.result() for r in requests]
        again = engine.submit(prompt, max_new_tokens=NEW)
        tokens.append(again.result())
        cache = engine.prefix_cache
        assert len(cache) == 1 and cache.nbytes == next(iter(cache.entries.values())).nbytes
    reused = (length - 1) // BLOCK * BLOCK
    assert again.cached_tokens == reused
    expected = _alone(invariant, prompt)
    for got in tokens:
        _same(got, expected)


def test_a_chat_history_replaces_the_entry_of_its_previous_turn(onnx_model):
    vocab = onnx_model.manifest.src_vocab
    turn = _prefix(vocab, 20)
    with Engine(onnx_model, prefix_cache_bytes=10**7) as engine:
        first = engine.submit(turn, max_new_tokens=NEW)
        reply = first.result()
        follow = np.concatenate([turn, reply, [5, 6, 7]])
        second = engine.submit(follow, max_new_tokens=NEW)
        _same(second.result(), _alone(onnx_model, follow))
        cache = engine.prefix_cache
        assert second.cached_tokens == len(turn) and len(cache) == 1
        assert [e.tokens.tolist() for e in cache.entries.values()] == [follow.tolist()]


def test_entries_past_the_byte_bound_leave_least_recently_used_first(onnx_model):
    vocab = onnx_model.manifest.src_vocab
    a, b, c = (_prefix(vocab, 2 * BLOCK, seed=s) for s in (10, 11, 12))
    with Engine(onnx_model, prefix_cache_bytes=10**7) as probe:
        probe.submit(a, max_new_tokens=1).result()
        size = probe.prefix_cache.nbytes  # one entry of 2 * BLOCK tokens
    with Engine(onnx_model, prefix_cache_bytes=2 * size) as engine:
        cache = engine.prefix_cache
        _run(engine, [a, b])
        assert [e.tokens.tolist() for e in cache.entries.values()] == [a.tolist(), b.tolist()]
        a2 = np.concatenate([a[:-1], [4]])
        again = engine.submit(a2, max_new_tokens=NEW)  # continues a: b is now the older one
        _same(again.result(), _alone(onnx_model, a2))
        assert again.cached_tokens == len(a) - 1 and cache.evictions == 1
        assert [e.tokens.tolist() for e in cache.entries.values()] == [a.tolist(), a2.tolist()]
        _run(engine, [c])
        assert [e.tokens.tolist() for e in cache.entries.values()] == [a2.tolist(), c.tolist()]
        assert cache.evictions == 2 and cache.nbytes == 2 * size
        late = engine.submit(np.concatenate([b, [3]]), max_new_tokens=NEW)  # b is gone: a miss
        _same(late.result(), _alone(onnx_model, np.concatenate([b, [3]])))
        assert late.cached_tokens == 0
    with Engine(onnx_model, prefix_cache_bytes=size - 1) as small:  # no entry fits: none kept
        _run(small, [a, a])
        assert len(small.prefix_cache) == 0 and small.prefix_cache.misses == 2


def test_concurrent_requests_sharing_a_prefix_prefill_it_once(onnx_model):
    """Six requests waiting together: the first is prefilled from scratch, the five others wait
    for it and then continue its prefix together, in one run."""
    vocab = onnx_model.manifest.src_vocab
    prefix = _prefix(vocab, 36, seed=3)
    prompts = [np.concatenate([prefix, ending]) for ending in _endings(vocab, 6, seed=4)]
    engine = Engine(onnx_model, max_batch=8, prefix_cache_bytes=10**7, start=False)
    try:
        requests = [engine.submit(p, max_new_tokens=NEW) for p in prompts]
        engine.start()
        results = [r.result() for r in requests]
        cache = engine.prefix_cache
        assert engine.stats.prefills == 2 and (cache.hits, cache.misses) == (5, 1)
        assert sorted(r.cached_tokens for r in requests) == [0] + [len(prefix)] * 5
        # the shortest of the five was left-padded in their run: its entry holds its real columns
        padded = sorted(prompts, key=len)[1]
        assert len(padded) < max(map(len, prompts))
        again = engine.submit(padded, max_new_tokens=NEW)
        _same(again.result(), _alone(onnx_model, padded))
        assert again.cached_tokens == len(padded) - 1
    finally:
        engine.close()
    for prompt, tokens in zip(prompts, results, strict=True):
        _same(tokens, _alone(onnx_model, prompt))


def test_block_keys_chain_whole_blocks_and_a_bad_bound_is_refused(onnx_model):
    ids = np.arange(3 * BLOCK + 5, dtype=np.int64)
    keys = block_keys(ids)
    assert len(keys) == 3 and keys[:2] == block_keys(ids[:2 * BLOCK])
    assert block_keys(np.concatenate([[1], ids[1:]]))[2] != keys[2]  # the first block changes all
    with pytest.raises(InputError, match="prefix_cache_bytes"):
        Engine(onnx_model, prefix_cache_bytes=-1, start=False)


def test_a_prefill_after_a_cached_past_equals_the_whole_prompts(onnx_model):
    """The step graph continuing a past of k columns gives the logits and cache of one prefill
    of the whole prompt (bitwise, on the CPU in float32); ``take`` copies a row's columns."""
    decoder = onnx_model.batch_decoder()
    prompt = _prefix(onnx_model.manifest.src_vocab, 30, seed=5)
    whole, logits = decoder.prefill([prompt])
    head, _ = decoder.prefill([prompt[:20]])
    past = decoder.cache_ops.take(head.cache, np.zeros(2, np.int64), np.arange(20))  # two rows
    rest, continued = decoder.prefill([prompt[20:], prompt[25:]], past, 20)
    np.testing.assert_array_equal(continued[0], logits[0])
    assert rest.mask.tolist()[1] == [1] * 20 + [0] * 5 + [1] * 5  # padding between past and rest
    for mine, theirs in zip(rest.cache, whole.cache, strict=True):
        np.testing.assert_array_equal(mine.numpy()[:1], theirs.numpy())
    taken = decoder.cache_ops.take(rest.cache, np.array([1]), np.flatnonzero(rest.mask[1]))
    assert taken[0].shape() == [1, whole.cache[0].shape()[1], 25, whole.cache[0].shape()[3]]


def test_requests_continuing_one_previous_turn_together_both_reuse_it(onnx_model):
    """Two waiting requests that both continue a cached prompt whole: the first one's entry
    replaces it during their run, and the second still counts its hit."""
    vocab = onnx_model.manifest.src_vocab
    turn = _prefix(vocab, 20, seed=6)
    prompts = [np.concatenate([turn, ending]) for ending in _endings(vocab, 2, seed=7)]
    engine = Engine(onnx_model, prefix_cache_bytes=10**7, start=False)
    try:
        first = engine.submit(turn, max_new_tokens=1)
        engine.run_once()  # the loop's admission, by hand: the turn is prefilled, kept, and ends
        assert first.finish_reason == "length" and len(engine.prefix_cache) == 1
        requests = [engine.submit(p, max_new_tokens=NEW) for p in prompts]
        engine.start()
        results = [r.result() for r in requests]
        assert [r.finish_reason for r in requests] == ["length"] * 2, requests[0].error
        assert [r.cached_tokens for r in requests] == [len(turn), len(turn)]
        held = [e.tokens.tolist() for e in engine.prefix_cache.entries.values()]
        assert sorted(held) == sorted(p.tolist() for p in prompts)  # the turn was replaced
    finally:
        engine.close()
    for prompt, tokens in zip(prompts, results, strict=True):
        _same(tokens, _alone(onnx_model, prompt))


def test_a_hit_waiting_behind_a_shorter_prompt_without_one_is_prefilled_from_its_hit(onnx_model):
    """Waiting requests are taken shortest first: a cache hit behind a shorter prompt that has
    none leaves the queue on its own (requests are compared by identity, never by their arrays)."""
    vocab = onnx_model.manifest.src_vocab
    turn, short = _prefix(vocab, 20, seed=8), _prefix(vocab, 5, seed=9)
    longer = np.concatenate([turn, _endings(vocab, 1, seed=10)[0]])
    engine = Engine(onnx_model, prefix_cache_bytes=10**7, start=False)
    try:
        engine.submit(turn, max_new_tokens=1)
        engine.run_once()  # the turn is prefilled and kept
        requests = [engine.submit(p, max_new_tokens=NEW) for p in (short, longer)]
        engine.start()
        results = [r.result() for r in requests]
        assert [r.finish_reason for r in requests] == ["length"] * 2, requests[0].error
        assert [r.cached_tokens for r in requests] == [0, len(turn)]
    finally:
        engine.close()
    for prompt, tokens in zip((short, longer), results, strict=True):
        _same(tokens, _alone(onnx_model, prompt))
