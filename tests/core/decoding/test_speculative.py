"""Speculative decoding with prompt lookup (``prompt_lookup_num_tokens``): the drafts follow
the longest earlier match (transformers' candidates where the text copies), greedy search gives
plain greedy's tokens in both runtimes while drafts are accepted, rejected drafts leave the
cache as plain decoding would, and speculative sampling draws from the processed softmax."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

import transformer_kit as tk
from tests.core.decoding.test_sampling import DRAWS, _chi_square_limit
from transformer_kit.core.decoding import build_pipeline, generation_config
from transformer_kit.core.decoding.search import DecodingCall
from transformer_kit.core.decoding.speculative import (
    LONGEST_MATCH,
    DraftLength,
    _Chooser,
    lookup_match,
    prompt_lookup,
)
from transformer_kit.core.decoding.torch_steps import DecoderStepper
from transformer_kit.core.errors import InputError
from transformer_kit.runtime.stepper import LayoutStepper

#: Prompts that repeat themselves, so that prompt lookup finds drafts from the first step.
REPEATING = [[5, 9, 12, 7, 5, 9, 12, 7, 5, 9], [3, 4, 30, 31, 32, 33, 3, 4, 30, 31, 32, 33, 3, 4],
             [20, 21, 22, 23, 24, 25, 26, 27, 28, 20, 21, 22]]


def _best_match(ids: list[int], ngram: int) -> tuple[int, int]:
    """lookup_match written out: (start, matched) of the earlier occurrence of the longest last
    n-gram (n <= ngram) whose preceding ids match longest, the latest of equals; (0, 0): none."""
    for n in range(min(ngram, len(ids) - 1), 0, -1):
        best = None
        for i in range(len(ids) - n):  # an occurrence ids[i:i + n], ending before the last id
            if ids[i:i + n] != ids[len(ids) - n:]:
                continue
            matched = n
            while (matched < LONGEST_MATCH and i - (matched - n) - 1 >= 0
                   and ids[i - (matched - n) - 1] == ids[len(ids) - matched - 1]):
                matched += 1
            if best is None or matched >= best[1]:
                best = (i + n, matched)
        if best is not None:
            return best
    return 0, 0


@pytest.mark.parametrize("seed", range(60))
def test_drafts_follow_the_longest_earlier_match(seed):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 4, int(rng.integers(2, 60)))  # a small vocabulary: many earlier matches
    ngram, count, eos = int(rng.integers(1, 4)), int(rng.integers(1, 12)), [int(rng.integers(0, 6))]
    start, matched = _best_match(ids.tolist(), ngram)
    assert lookup_match(ids, ngram) == (start, matched)
    expected = ids[start:start + min(count, 2 ** (matched - 1))] if matched else ids[:0]
    ends = [i for i, t in enumerate(expected) if t in eos]
    expected = expected[:ends[0]] if ends else expected
    np.testing.assert_array_equal(prompt_lookup(ids, ngram, count, eos), expected)


@pytest.mark.parametrize("seed", range(20))
def test_a_draft_from_one_long_match_is_transformers_prompt_lookup_candidate(seed):
    """Text copied from the prompt: its last n-gram occurs once earlier, after enough matching
    ids for the whole draft; the draft is then transformers' candidate."""
    rng = np.random.default_rng(seed)
    source = rng.permutation(200)[:int(rng.integers(20, 40))]  # no id twice
    copied = int(rng.integers(LONGEST_MATCH, len(source) - 1))
    ids = np.concatenate([source, [500, 501], source[:copied]])
    ngram, count = int(rng.integers(1, 4)), int(rng.integers(1, 2 ** (LONGEST_MATCH - 1)))
    hf = PromptLookupCandidateGenerator(eos_token_id=torch.tensor([999]), num_output_tokens=count,
                                        max_matching_ngram_size=ngram, max_length=10_000)
    candidates, _ = hf.get_candidates(torch.from_numpy(ids)[None])
    expected = candidates[0, len(ids):].numpy()
    np.testing.assert_array_equal(prompt_lookup(ids, ngram, count, [999]), expected)
    assert len(expected) >= min(count, len(source) - copied) > 0  # the copy goes on


def test_short_matches_draft_little():
    """A match of one id drafts one token, of two ids two, of three four: chance matches cost a
    short check; the draft grows as the reply keeps copying."""
    text = [7, 1, 2, 3, 4, 5, 6, 8, 9, 10, 11, 12, 13, 14, 15]
    for matched, tail in ((1, [40, 30, 4]), (2, [40, 3, 4]), (3, [2, 3, 4]), (4, [1, 2, 3, 4])):
        ids = np.array([*text, 90, *tail], np.int64)
        assert lookup_match(ids, 2)[1] == matched
        np.testing.assert_array_equal(prompt_lookup(ids, 2, 10, []), text[5:5 + 2 ** (matched - 1)])


class _Counting:
    """Counts the tokens each runtime's ``verify`` checked and the steps it ran."""

    def __init__(self, monkeypatch) -> None:
        self.verified, self.steps = 0, 0
        for cls in (LayoutStepper, DecoderStepper):
            verify, step = cls.verify, cls.next

            def counted_verify(stepper, tokens, verify=verify):
                self.verified += len(tokens) - 1
                self.steps += 1
                return verify(stepper, tokens)

            def counted_next(stepper, tokens, rows, step=step):
                self.steps += 1
                return step(stepper, tokens, rows)
            monkeypatch.setattr(cls, "verify", counted_verify)
            monkeypatch.setattr(cls, "next", counted_next)


@pytest.mark.parametrize("runtime", ["torch", "onnxruntime"])
@pytest.mark.parametrize("prompt", range(len(REPEATING)))
def test_greedy_with_prompt_lookup_gives_plain_greedys_tokens(runtimes, runtime, prompt, monkeypatch):
    model, onnx_model = runtimes
    ids = np.array([REPEATING[prompt]])
    generate = (onnx_model.generate if runtime == "onnxruntime"
                else lambda x, n, **o: model.generate(torch.from_numpy(x), n, **o).numpy())
    plain = generate(ids, 40, min_new_tokens=40)
    counting = _Counting(monkeypatch)
    for drafts in (1, 3, 10):
        np.testing.assert_array_equal(generate(ids, 40, min_new_tokens=40, prompt_lookup_num_tokens=drafts),
                                      plain)
    assert counting.verified > 0  # drafts were checked ...
    assert counting.steps < 3 * 39  # ... and accepted: fewer steps than tokens


def test_an_end_id_inside_an_accepted_draft_ends_the_row_there(runtimes):
    _, onnx_model = runtimes
    ids = np.array([REPEATING[0]])
    plain = onnx_model.generate(ids, 30, min_new_tokens=30, eos_id=[])[0]
    end = int(plain[12])  # a token the row reaches after some steps, likely inside a draft
    expected = onnx_model.generate(ids, 30, eos_id=end)
    np.testing.assert_array_equal(onnx_model.generate(ids, 30, eos_id=end, prompt_lookup_num_tokens=8),
                                  expected)
    assert end in expected[0].tolist()


@pytest.mark.parametrize("runtime", ["torch", "onnxruntime"])
def test_rejected_drafts_leave_the_cache_as_plain_decoding_would(runtimes, runtime):
    """Many rejected drafts (their columns masked, the onnxruntime cache compacted after 64):
    the next logits equal those of a plain run of the accepted tokens."""
    model, onnx_model = runtimes
    rng = np.random.default_rng(0)
    prompt = np.array([REPEATING[1]])
    options = generation_config(max_new_tokens=20)

    def stepper():
        if runtime == "onnxruntime":
            return onnx_model._plan(prompt, None, options, None)[0]
        real = torch.ones(prompt.shape, dtype=torch.bool)
        return DecoderStepper(model, torch.from_numpy(prompt), real, use_cache=True)
    speculative, plain = stepper(), stepper()
    logits, expected = speculative.first(), plain.first()
    for _ in range(12):
        token = np.array([int(expected[0].argmax())])
        drafts = rng.integers(3, 40, 6)
        logits = speculative.verify(np.concatenate([token, drafts]))[:1]  # the drafts rejected
        speculative.drop(len(drafts))
        expected = plain.next(token, None)
        np.testing.assert_allclose(logits, expected, rtol=1e-4, atol=1e-5)
    if runtime == "onnxruntime":  # 72 dropped columns: compacted once, 12 left since
        assert speculative.length == prompt.shape[1] + 12 + speculative.dropped
        assert speculative.dropped == 6 * (12 - 11)
    after = speculative.next(np.array([int(expected[0].argmax())]), None)
    np.testing.assert_allclose(after, plain.next(np.array([int(expected[0].argmax())]), None),
                               rtol=1e-4, atol=1e-5)


def _assert_draws_follow(draws: list[int], expected: np.ndarray) -> None:
    """``draws`` come from the distribution ``expected`` (vocab,): never a token outside its
    support, and a chi-square within the quantile at p = 1 - 1e-4, as plain sampling's test."""
    counts = np.bincount(draws, minlength=len(expected))
    support = expected > 0
    assert counts[~support].sum() == 0
    observed, wanted = counts[support], len(draws) * expected[support]
    chi_square = float(((observed - wanted) ** 2 / wanted).sum())
    assert chi_square < _chi_square_limit(int(support.sum()) - 1), (chi_square, support.sum())


@pytest.mark.parametrize("options", [{}, {"temperature": 0.7, "top_k": 10}, {"top_p": 0.8}],
                         ids=["plain", "temperature-top_k", "top_p"])
@pytest.mark.parametrize("draft", ["likely", "unlikely"])
def test_speculative_sampling_draws_from_the_processed_softmax(runtimes, options, draft):
    """A drafted token accepted with probability p(d), else a draw from p without d: in all,
    the draws follow p (chi-square, as plain sampling's test), whichever token was drafted."""
    model, _ = runtimes
    prompt = torch.tensor([REPEATING[2]])
    with torch.no_grad():
        logits = model(prompt)[0, -1].float().numpy()
    config = generation_config(do_sample=True, prompt_lookup_num_tokens=3, seed=0, **options)
    _, pipeline = build_pipeline(config, len(logits), [2])
    call = DecodingCall(prompt.numpy(), np.ones(prompt.shape, bool), [2], 0)
    state = _Chooser(call, config, pipeline).history.state(prompt.shape[1])
    processed = pipeline(logits[None].copy(), state)
    expected = np.exp(processed[0].astype(np.float64) - processed[0].max())
    expected /= expected.sum()
    order = np.argsort(-expected)
    drafted = int(order[0] if draft == "likely" else order[int((expected > 0).sum()) - 1])
    chooser = _Chooser(call, config, pipeline)
    _assert_draws_follow([chooser.choose(logits.copy(), drafted) for _ in range(DRAWS)], expected)


def test_accepting_every_draft_fails_the_check(runtimes):
    """The check has power: always taking the drafted token is far from p."""
    model, _ = runtimes
    with torch.no_grad():
        logits = model(torch.tensor([REPEATING[2]]))[0, -1].double().numpy()
    expected = np.exp(logits - logits.max())
    expected /= expected.sum()
    drafted = int(np.argmax(expected))
    counts = np.zeros(len(expected))
    draws = np.random.default_rng(0).choice(len(expected), DRAWS // 2, p=expected)
    counts += np.bincount(draws, minlength=len(expected))
    counts[drafted] += DRAWS - DRAWS // 2  # half the draws: the draft kept without a test
    wanted = DRAWS * expected
    chi_square = float(((counts - wanted) ** 2 / wanted).sum())
    assert chi_square > _chi_square_limit(len(expected) - 1)


def test_sampling_with_prompt_lookup_is_seeded_and_the_same_in_both_runtimes(runtimes):
    model, onnx_model = runtimes
    ids = np.array([REPEATING[0]])
    options = {"do_sample": True, "seed": 7, "prompt_lookup_num_tokens": 4, "temperature": 0.8}
    ours = model.generate(torch.from_numpy(ids), 30, **options).numpy()
    np.testing.assert_array_equal(onnx_model.generate(ids, 30, **options), ours)
    np.testing.assert_array_equal(onnx_model.generate(ids, 30, **options), ours)  # again


@pytest.mark.parametrize(("prompts", "options", "words"), [
    (REPEATING[:1] * 2, {"prompt_lookup_num_tokens": 3}, "one prompt at a time"),
    (REPEATING[:1], {"num_beams": 2, "prompt_lookup_num_tokens": 3}, "num_beams=2"),
    (REPEATING[:1], {"prompt_lookup_num_tokens": 0}, "prompt_lookup_num_tokens"),
    (REPEATING[:1], {"prompt_lookup_num_tokens": 2, "response_format": {"type": "json_object"}},
     "response_format"),
])
def test_what_prompt_lookup_cannot_do_is_refused_with_a_sentence(runtimes, prompts, options, words):
    _, onnx_model = runtimes
    with pytest.raises(InputError, match=words):
        onnx_model.generate(np.array(prompts), 5, **options)


def test_an_encoder_decoder_is_refused_with_a_sentence():
    torch.manual_seed(0)
    model = tk.build_model({"architecture": "encoder_decoder", "vocab_size": 30, "d_model": 16,
                            "num_heads": 2, "num_layers": 1, "d_ff": 32, "pad_id": 0, "bos_id": 1,
                            "eos_id": 2}).eval()
    with pytest.raises(InputError, match="decoder-only"):
        model.generate(torch.tensor([[5, 6, 7]]), 4, prompt_lookup_num_tokens=2)


def test_an_assistants_draft_length_follows_how_its_drafts_fared():
    length = DraftLength(10)
    assert length.now(100) == 10 and length.now(5) == 4  # the last step gives one more token
    length.update(10, 3)  # in part: one longer than what stood
    assert length.now(100) == 4
    length.update(4, 4)  # whole: 2 longer, up to the most
    assert length.now(100) == 6
    length.update(6, 0)
    assert length.now(100) == 1


# -- an assistant model (a draft model) ---------------------------------------------------------
@pytest.fixture(scope="module")
def assistants(tmp_path_factory):
    """A smaller decoder of the same vocabulary (1 layer, trained on nothing: its drafts are
    sometimes right), in PyTorch and exported."""
    from tests.core.decoding.conftest import small_decoder
    from transformer_kit.export import export_onnx
    from transformer_kit.runtime import OnnxModel

    model = small_decoder(num_layers=1, d_model=16, num_heads=2, d_ff=32)
    folder = tmp_path_factory.mktemp("assistant")
    export_onnx(model, folder)
    return model, OnnxModel(folder, providers="cpu")


@pytest.mark.parametrize("runtime", ["torch", "onnxruntime"])
def test_greedy_with_an_assistant_gives_plain_greedys_tokens(runtimes, assistants, runtime, monkeypatch):
    (model, onnx_model), (small, onnx_small) = runtimes, assistants
    counting = _Counting(monkeypatch)
    for prompt in REPEATING:
        ids = np.array([prompt])
        if runtime == "onnxruntime":
            plain = onnx_model.generate(ids, 30, min_new_tokens=30)
            ours = onnx_model.generate(ids, 30, min_new_tokens=30, assistant_model=onnx_small,
                                       num_assistant_tokens=4)
        else:
            plain = model.generate(torch.from_numpy(ids), 30, min_new_tokens=30).numpy()
            ours = model.generate(torch.from_numpy(ids), 30, min_new_tokens=30, assistant_model=small,
                                  num_assistant_tokens=4).numpy()
        np.testing.assert_array_equal(ours, plain)
    assert counting.verified > 0


def test_the_same_assistant_drafts_every_token_right(runtimes):
    """The model as its own assistant: every draft stands, one step checks 4 drafts and adds one."""
    _, onnx_model = runtimes
    ids = np.array([REPEATING[1]])
    plain = onnx_model.generate(ids, 25, min_new_tokens=25)
    calls = []
    original = LayoutStepper.verify

    def verify(stepper, tokens):
        calls.append(len(tokens))
        return original(stepper, tokens)
    LayoutStepper.verify = verify
    try:
        ours = onnx_model.generate(ids, 25, min_new_tokens=25, assistant_model=onnx_model,
                                   num_assistant_tokens=4)
    finally:
        LayoutStepper.verify = original
    np.testing.assert_array_equal(ours, plain)
    # the model checks the last token and 4 drafts; the assistant then runs the 4th draft and
    # the model's next token in one step of its own (its 3 first drafts stood in its cache)
    checks, catch_ups = calls[0::2], calls[1::2]
    assert len(checks) >= 3 and all(n == 5 for n in checks[:-1]) and set(catch_ups) == {2}


@pytest.mark.parametrize("options", [{}, {"temperature": 0.7, "top_k": 10}],
                         ids=["plain", "temperature-top_k"])
def test_speculative_sampling_from_an_assistant_draws_from_the_processed_softmax(runtimes, assistants,
                                                                                options):
    """Drafts drawn from the assistant's q, each kept with min(1, p/q), else a draw from
    max(p - q, 0): the tokens follow p (chi-square)."""
    (model, _), (small, _) = runtimes, assistants
    prompt = torch.tensor([REPEATING[2]])
    with torch.no_grad():
        logits, small_logits = (m(prompt)[0, -1].float().numpy() for m in (model, small))
    config = generation_config(do_sample=True, seed=0, **options)
    _, pipeline = build_pipeline(config, len(logits), [2])
    call = DecodingCall(prompt.numpy(), np.ones(prompt.shape, bool), [2], 0)
    chooser = _Chooser(call, config, pipeline)
    processed = chooser.processed(logits.copy())[0].astype(np.float64)
    expected = np.exp(processed - processed.max())
    expected /= expected.sum()
    draws = []
    for _ in range(DRAWS):
        drafted, q = chooser.draw(small_logits.copy())
        draws.append(chooser.choose(logits.copy(), drafted, q))
    _assert_draws_follow(draws, expected)
    q = chooser.draw(small_logits.copy())[1]
    assert np.abs(q - expected).sum() > 0.3  # the assistant's distribution is another one


def test_sampling_with_an_assistant_is_seeded_and_the_same_in_both_runtimes(runtimes, assistants):
    (model, onnx_model), (small, onnx_small) = runtimes, assistants
    ids = np.array([REPEATING[0]])
    options = {"do_sample": True, "seed": 3, "num_assistant_tokens": 3}
    ours = model.generate(torch.from_numpy(ids), 20, assistant_model=small, **options).numpy()
    np.testing.assert_array_equal(onnx_model.generate(ids, 20, assistant_model=onnx_small, **options), ours)


def test_an_assistant_that_cannot_draft_is_refused_with_a_sentence(runtimes, assistants, tmp_path):
    (model, onnx_model), (small, onnx_small) = runtimes, assistants
    ids = np.array([REPEATING[0]])
    with pytest.raises(InputError, match="either an assistant model or prompt_lookup_num_tokens"):
        onnx_model.generate(ids, 5, assistant_model=onnx_small, prompt_lookup_num_tokens=2)
    with pytest.raises(InputError, match="must be an OnnxModel"):
        onnx_model.generate(ids, 5, assistant_model=small)
    other = tk.build_model({**small.config.model_dump(), "vocab_size": 60}).eval()
    with pytest.raises(InputError, match="vocabulary has 60 tokens"):
        model.generate(torch.from_numpy(ids), 5, assistant_model=other)
