"""The sampling fields /v1/completions and /v1/chat/completions share, each taking effect, on
127.0.0.1 over the chat checkpoint of tests/chat/checkpoint.py (a random Qwen2): where
transformers' ``generate`` has the option (repetition_penalty, top_k, min_p, min_new_tokens,
sequence_bias for logit_bias, end ids) the served tokens are its tokens, greedy and seeded
(sampled: transformers' processors and warpers, then the kit's seeded draw); OpenAI's presence
and frequency penalties and ``n`` give ``OnnxModel.generate``'s tokens with the same options
(choice i: seed + i); ``ignore_eos``, ``min_tokens``, ``stop_token_ids``,
``include_stop_str_in_output``, ``skip_special_tokens`` and ``stream_options`` do what they
say; null is a field's default; bad values get 400 with a sentence."""

from __future__ import annotations

import json

import httpx
import numpy as np
import openai
import pytest
import torch
import transformers.generation.logits_process as hf_lp

from tests.apps.serving.test_chat import CONVERSATIONS, _client, _plain, chat_export, reference  # noqa: F401
from transformer_kit.apps.serving.http import create_app
from transformer_kit.apps.serving.http import serve_in_thread as running
from transformer_kit.apps.serving.sampling_fields import MAX_CHOICES
from transformer_kit.core.decoding.call import sample_rows
from transformer_kit.runtime import Engine

#: The model's end ids (generation_config.json's <|im_end|> and <|endoftext|>).
ENDS = [2, 0]
NEW = 16
GREEDY = {"temperature": 0}
SAMPLED = {"temperature": 0.9, "seed": 7}


@pytest.fixture(scope="module")
def server(chat_export):  # noqa: F811
    _, om = chat_export
    engine = Engine(om, max_batch=16, max_queue=64)
    with running(create_app(engine, "chat")) as url:
        yield url
    engine.close()


@pytest.fixture(scope="module")
def prompt(chat_export) -> list[int]:  # noqa: F811
    _, om = chat_export
    return om.tokenizer.encode(["The weather in Paris is sunny, 21 degrees."])[0][0].tolist()


@pytest.fixture(scope="module")
def repeating(chat_export) -> list[int]:  # noqa: F811
    """A prompt whose greedy reply repeats a token: the penalties have something to change."""
    _, om = chat_export
    return om.tokenizer.encode(["sunny sunny sunny sunny"])[0][0].tolist()


def _complete(url: str, **body) -> dict:
    reply = httpx.post(f"{url}/v1/completions", json={"model": "chat", "max_tokens": NEW, **body},
                       timeout=60)
    assert reply.status_code == 200, reply.text
    return reply.json()


def _ids(url: str, prompt: list[int], **body) -> list[int]:
    return _complete(url, prompt=prompt, **body)["choices"][0]["token_ids"]


def _upto_end(tokens: list[int], ends: list[int]) -> list[int]:
    """The tokens up to and including the first end id."""
    cut = next((i for i, t in enumerate(tokens) if t in ends), None)
    return tokens if cut is None else tokens[:cut + 1]


def _generate(om, prompt: list[int], new: int = NEW, **options) -> list[int]:
    """``OnnxModel.generate``'s new tokens for ``prompt`` alone, up to and including an end id."""
    ids = np.array([prompt])
    row = om.generate(ids, attention_mask=np.ones(ids.shape), max_new_tokens=new, **options)[0].tolist()
    return _upto_end(row, options.get("eos_id", ENDS))


class _KitDraw(hf_lp.LogitsProcessor):
    """The kit's seeded draw (one uniform a step, inverse CDF over the finite scores) from
    transformers' processed scores, as the last processor of a greedy ``generate``: all but the
    drawn token -inf, so transformers' generate samples what the kit samples with that seed."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        token = sample_rows(scores.float().numpy(), self.rng)
        drawn = torch.full_like(scores, -torch.inf)
        drawn[torch.arange(len(scores)), torch.from_numpy(token)] = 0.0
        return drawn


def _transformers(reference, prompt: list[int], sampled: dict | None = None,  # noqa: F811
                  warpers: list | None = None, **options) -> list[int]:
    """transformers' ``generate`` new tokens, up to and including an end id: greedy, or with
    ``sampled`` (temperature, seed) its temperature and ``warpers`` then the kit's draw."""
    model, _ = reference
    processors = hf_lp.LogitsProcessorList()
    if sampled is not None:
        processors.extend([hf_lp.TemperatureLogitsWarper(sampled["temperature"]), *(warpers or []),
                           _KitDraw(sampled["seed"])])
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, do_sample=False,
                             logits_processor=processors, **options)
    return _upto_end(out[0, len(prompt):].tolist(), options.get("eos_token_id", ENDS))


def _plain_token(tokens: list[int], step: int) -> int:
    """The token a reply without the fields gives at ``step`` (not an end id, nor earlier)."""
    assert len(tokens) > step and tokens[step] not in ENDS and tokens[step] not in tokens[:step]
    return tokens[step]


#: case -> (the request's fields, transformers' options, transformers' warpers); "{t}" is the
#: token the reply without the fields gives at step 3, "{first}" the one at step 0.
CASES = {
    "repetition_penalty": ({"repetition_penalty": 1.3}, {"repetition_penalty": 1.3}, []),
    "top_k": ({"top_k": 5}, {}, [hf_lp.TopKLogitsWarper(5)]),
    "min_p": ({"min_p": 0.1}, {}, [hf_lp.MinPLogitsWarper(0.1)]),
    "logit_bias": ({"logit_bias": {"{first}": -100, "100": 4.0}},
                   {"sequence_bias": [[["{first}"], -100.0], [[100], 4.0]]}, []),
    "stop_token_ids": ({"stop_token_ids": ["{t}"]}, {"eos_token_id": [*ENDS, "{t}"]}, []),
    "min_tokens": ({"stop_token_ids": ["{t}"], "min_tokens": 6},
                   {"eos_token_id": [*ENDS, "{t}"], "min_new_tokens": 6}, []),
    "all": ({"repetition_penalty": 1.2, "top_k": 40, "min_p": 0.05, "logit_bias": {"100": 2.0},
             "min_tokens": 4},
            {"repetition_penalty": 1.2, "sequence_bias": [[[100], 2.0]], "min_new_tokens": 4},
            [hf_lp.TopKLogitsWarper(40), hf_lp.MinPLogitsWarper(0.05)]),
}


def _filled(value, tokens: dict[str, int]):
    """``value`` with its "{t}" and "{first}" placeholders (strings, keys, list items) filled."""
    if isinstance(value, dict):
        return {_filled(k, tokens): _filled(v, tokens) for k, v in value.items()}
    if isinstance(value, list):
        return [_filled(v, tokens) for v in value]
    if isinstance(value, str) and value.startswith("{") and value.endswith("}"):
        return tokens[value[1:-1]]
    return value


@pytest.mark.parametrize("mode", ["greedy", "sampled"])
@pytest.mark.parametrize("case", list(CASES))
def test_served_tokens_equal_transformers_generate(server, reference, prompt, repeating, case,  # noqa: F811
                                                  mode):
    fields, hf_options, warpers = CASES[case]
    prompt = repeating if "repetition_penalty" in fields else prompt
    sampling, sampled = (GREEDY, None) if mode == "greedy" else (SAMPLED, SAMPLED)
    plain = _ids(server, prompt, **sampling)
    assert plain == _transformers(reference, prompt, sampled)
    tokens = {"t": plain[3], "first": plain[0]}
    hf_options, fields = _filled(hf_options, tokens), _filled(fields, tokens)
    if "logit_bias" in fields:  # JSON's keys are strings
        fields["logit_bias"] = {str(k): v for k, v in fields["logit_bias"].items()}
    served = _complete(server, prompt=prompt, **sampling, **fields)["choices"][0]
    assert served["token_ids"] == _transformers(reference, prompt, sampled, warpers if sampled else [],
                                                **hf_options)
    if mode == "sampled" or case not in ("top_k", "min_p"):  # greedy search ignores the warpers
        assert served["token_ids"] != plain  # the field took effect
    else:
        assert served["token_ids"] == plain
    ends = hf_options.get("eos_token_id", ENDS)
    if served["token_ids"][-1] in ends:
        assert served["finish_reason"] == "stop"
    if "min_new_tokens" in hf_options:
        assert not set(served["token_ids"][:hf_options["min_new_tokens"]]) & set(ends)
    if case == "stop_token_ids":  # it ends at that id, finish_reason stop
        assert served["token_ids"] == plain[:plain.index(tokens["t"]) + 1]
        assert served["finish_reason"] == "stop"


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_presence_and_frequency_penalties_equal_onnx_model_generate(server, chat_export, repeating,  # noqa: F811
                                                                    sampling):
    _, om = chat_export
    prompt = repeating
    penalties = {"presence_penalty": 1.5, "frequency_penalty": 0.7}
    options = {} if sampling is GREEDY else {"do_sample": True, "temperature": 0.9, "seed": 7}
    served = _ids(server, prompt, **sampling, **penalties)
    assert served == _generate(om, prompt, **options, **penalties)
    assert served != _ids(server, prompt, **sampling)
    negative = {"presence_penalty": -2.0, "frequency_penalty": -1.0}  # favours repeats
    assert _ids(server, prompt, **sampling, **negative) == _generate(om, prompt, **options, **negative)


def test_n_choices_equal_generate_per_seed_whole_and_streamed(server, chat_export, prompt):  # noqa: F811
    """Choice i samples with seed + i (``OnnxModel.generate(..., seed=seed + i)``); greedy
    choices are alike, as vLLM's; usage counts the prompt once and every choice's tokens."""
    _, om = chat_export
    client = _client(server)
    completion = client.completions.create(model="chat", prompt=prompt, max_tokens=NEW, n=3, temperature=0.9,
                                           seed=11)
    expected = [_generate(om, prompt, do_sample=True, temperature=0.9, seed=11 + i) for i in range(3)]
    assert [c.index for c in completion.choices] == [0, 1, 2]
    assert [c.model_extra["token_ids"] for c in completion.choices] == expected
    assert len({tuple(e) for e in expected}) == 3  # the seeds draw differently
    assert completion.usage.prompt_tokens == len(prompt)
    assert completion.usage.completion_tokens == sum(map(len, expected))
    streamed: dict[int, list[int]] = {0: [], 1: [], 2: []}
    reasons = {}
    for chunk in client.completions.create(model="chat", prompt=prompt, max_tokens=NEW, n=3, temperature=0.9,
                                           seed=11, stream=True):
        choice = chunk.choices[0]
        streamed[choice.index] += choice.model_extra["token_ids"]
        if choice.finish_reason:
            reasons[choice.index] = choice.finish_reason
    assert [streamed[i] for i in range(3)] == expected
    assert reasons == {c.index: c.finish_reason for c in completion.choices}
    greedy = client.completions.create(model="chat", prompt=prompt, max_tokens=NEW, n=2, temperature=0)
    assert [c.model_extra["token_ids"] for c in greedy.choices] == [_generate(om, prompt)] * 2


def test_n_chat_choices_equal_chat_per_seed_whole_and_streamed(server, chat_export):  # noqa: F811
    _, om = chat_export
    client, messages = _client(server), CONVERSATIONS[0]
    reply = client.chat.completions.create(model="chat", messages=messages, max_tokens=NEW, n=2,
                                           temperature=0.9, seed=3)
    expected = [om.chat(_plain(messages), max_new_tokens=NEW, do_sample=True, temperature=0.9,
                        seed=3 + i)["content"] for i in range(2)]
    assert [c.message.content for c in reply.choices] == expected and expected[0] != expected[1]
    assert [c.index for c in reply.choices] == [0, 1]
    texts, roles = {0: "", 1: ""}, []
    for chunk in client.chat.completions.create(model="chat", messages=messages, max_tokens=NEW, n=2,
                                                temperature=0.9, seed=3, stream=True):
        choice = chunk.choices[0]
        texts[choice.index] += choice.delta.content or ""
        if choice.delta.role:
            roles.append(choice.index)
    assert [texts[0], texts[1]] == expected and roles == [0, 1]


def _per_token_logprob(reference, prompt: list[int], tokens: list[int]) -> float:  # noqa: F811
    """transformers' log probability per token of ``tokens`` after ``prompt`` (its logits'
    log-softmax, float64)."""
    model, _ = reference
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1:-1].double()
    chosen = torch.log_softmax(logits, -1)[torch.arange(len(tokens)), torch.tensor(tokens)]
    return float(chosen.mean())


def test_best_of_answers_the_n_likeliest_per_token_of_transformers_draws(server, reference,  # noqa: F811
                                                                        prompt):
    """best_of 4, n 2: the four draws are transformers' (seed + i), and the two answered are
    those with the highest log probability per token by transformers' logits, best first;
    usage counts all four; best_of below n, or above it with stream, is 400."""
    draws = [_transformers(reference, prompt, {"temperature": 0.9, "seed": 5 + i}) for i in range(4)]
    scores = [_per_token_logprob(reference, prompt, d) for d in draws]
    ranked = sorted(range(4), key=lambda i: -scores[i])
    assert len({tuple(d) for d in draws}) == 4 and min(abs(scores[a] - scores[b])
                                                       for a in range(4) for b in range(a)) > 1e-3
    answer = _complete(server, prompt=[prompt, prompt[:-1]], n=2, best_of=4, temperature=0.9, seed=5)
    assert [c["index"] for c in answer["choices"]] == [0, 1, 2, 3]
    assert [c["token_ids"] for c in answer["choices"][:2]] == [draws[i] for i in ranked[:2]]
    assert all(c["logprobs"] is None for c in answer["choices"])  # not asked for
    second = [_transformers(reference, prompt[:-1], {"temperature": 0.9, "seed": 5 + i}) for i in range(4)]
    assert answer["usage"]["completion_tokens"] == sum(map(len, draws + second))
    assert answer["usage"]["prompt_tokens"] == 2 * len(prompt) - 1
    reported = _complete(server, prompt=prompt, n=1, best_of=4, temperature=0.9, seed=5, logprobs=2)
    best = reported["choices"][0]
    assert best["token_ids"] == draws[ranked[0]]
    # two alternatives a token and the sampled one (fewer keys where texts coincide: a dict)
    assert all(1 <= len(top) <= 3 for top in best["logprobs"]["top_logprobs"])
    assert np.mean(best["logprobs"]["token_logprobs"]) == pytest.approx(scores[ranked[0]], abs=1e-4)
    for fields, says in [({"n": 3, "best_of": 2}, "best_of (2) is less than n (3)"),
                         ({"best_of": 2, "stream": True}, "cannot stream")]:
        refused = httpx.post(f"{server}/v1/completions", timeout=60,
                             json={"model": "chat", "prompt": prompt, **fields})
        assert refused.status_code == 400 and says in refused.json()["error"]["message"]


def test_ignore_eos_and_min_tokens_give_exactly_max_tokens(server, chat_export, prompt):  # noqa: F811
    _, om = chat_export
    ending = {"temperature": 0, "logit_bias": {"2": 8.0}}  # <|im_end|> favoured: the reply ends at once
    assert _ids(server, prompt, **ending) == [2]
    held = _complete(server, prompt=prompt, **ending, min_tokens=NEW)["choices"][0]
    assert len(held["token_ids"]) == NEW and not set(held["token_ids"]) & set(ENDS)
    assert held["finish_reason"] == "length"
    ignored = _complete(server, prompt=prompt, **ending, ignore_eos=True)["choices"][0]
    assert ignored["token_ids"] == _generate(om, prompt, eos_id=[], logit_bias={2: 8.0})
    assert len(ignored["token_ids"]) == NEW and 2 in ignored["token_ids"][1:]  # went on past it
    assert ignored["finish_reason"] == "length"
    both = _ids(server, prompt, **SAMPLED, ignore_eos=True, min_tokens=NEW)
    assert len(both) == NEW


def test_stop_token_ids_end_the_reply_at_that_id(server, prompt):
    plain = _complete(server, prompt=prompt, temperature=0)["choices"][0]
    token = _plain_token(plain["token_ids"], 5)
    cut = _complete(server, prompt=prompt, temperature=0, stop_token_ids=[token])["choices"][0]
    assert cut["token_ids"] == plain["token_ids"][:plain["token_ids"].index(token) + 1]
    assert cut["finish_reason"] == "stop" and plain["text"].startswith(cut["text"])
    kept = _complete(server, prompt=prompt, temperature=0, stop_token_ids=[token],
                     include_stop_str_in_output=True)["choices"][0]
    assert len(kept["text"]) > len(cut["text"]) and plain["text"].startswith(kept["text"])


def test_include_stop_str_in_output_keeps_the_stop_string(server, prompt):
    full = _complete(server, prompt=prompt, temperature=0)["choices"][0]["text"]
    stop = full[5:8]
    assert _complete(server, prompt=prompt, temperature=0, stop=[stop])["choices"][0]["text"] == (
        full[:full.index(stop)])
    kept = full[:full.index(stop) + len(stop)]
    choice = _complete(server, prompt=prompt, temperature=0, stop=[stop],
                       include_stop_str_in_output=True)["choices"][0]
    assert choice["text"] == kept and choice["finish_reason"] == "stop"
    streamed = httpx.post(f"{server}/v1/chat/completions", timeout=60, json={
        "model": "chat", "messages": CONVERSATIONS[0], "max_tokens": NEW, "temperature": 0})
    content = streamed.json()["choices"][0]["message"]["content"]
    stop = content[4:7]
    chunks = _client(server).chat.completions.create(
        model="chat", messages=CONVERSATIONS[0], max_tokens=NEW, temperature=0, stop=stop, stream=True,
        extra_body={"include_stop_str_in_output": True})
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == (
        content[:content.index(stop) + len(stop)])


def test_special_tokens_appear_with_skip_special_tokens_false(server, prompt):
    forced = {"temperature": 0, "logit_bias": {"2": 100}, "ignore_eos": True, "max_tokens": 3}
    choice = _complete(server, prompt=prompt, **forced)["choices"][0]
    assert choice["token_ids"] == [2, 2, 2] and choice["text"] == ""
    written = _complete(server, prompt=prompt, **forced, skip_special_tokens=False)["choices"][0]
    assert written["text"] == "<|im_end|>" * 3
    chat = httpx.post(f"{server}/v1/chat/completions", timeout=60, json={
        "model": "chat", "messages": CONVERSATIONS[0], **forced, "skip_special_tokens": False})
    assert chat.json()["choices"][0]["message"]["content"] == "<|im_end|>" * 3


def _events(response: httpx.Response) -> list[dict]:
    return [json.loads(line[6:]) for line in response.iter_lines()
            if line.startswith("data: ") and line != "data: [DONE]"]


def test_continuous_usage_stats_count_the_tokens_so_far(server, prompt):
    body = {"model": "chat", "prompt": prompt, "max_tokens": NEW, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    with httpx.stream("POST", f"{server}/v1/completions", json=body, timeout=60) as response:
        events = _events(response)
    chunks, last = events[:-1], events[-1]
    so_far = 0
    for chunk in chunks:
        so_far += len(chunk["choices"][0]["token_ids"])
        assert chunk["usage"]["completion_tokens"] == so_far
        assert chunk["usage"]["prompt_tokens"] == len(prompt)
        assert chunk["usage"]["total_tokens"] == len(prompt) + so_far
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == so_far > 1
    with httpx.stream("POST", f"{server}/v1/completions", timeout=60, json={
            **body, "stream_options": {"include_usage": True}}) as response:
        events = _events(response)
    assert all(e["usage"] is None for e in events[:-1]) and events[-1]["usage"]["completion_tokens"] == so_far
    chat = {"model": "chat", "messages": CONVERSATIONS[0], "max_tokens": NEW, "temperature": 0, "n": 2,
            "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    with httpx.stream("POST", f"{server}/v1/chat/completions", json=chat, timeout=60) as response:
        events = _events(response)
    counts: dict[int, list[int]] = {0: [], 1: []}
    for event in events[:-1]:
        counts[event["choices"][0]["index"]].append(event["usage"]["completion_tokens"])
    whole = httpx.post(f"{server}/v1/chat/completions", timeout=60,
                       json={**chat, "stream": False, "stream_options": None}).json()
    for index in (0, 1):  # the role chunk first, then the counts so far, growing
        assert counts[index][0] == 0 and counts[index] == sorted(counts[index]) and counts[index][-1] > 1
    assert counts[0][-1] + counts[1][-1] == whole["usage"]["completion_tokens"]
    assert events[-1]["usage"] == whole["usage"]


def test_null_fields_mean_their_defaults(server, prompt):
    nulls = {name: None for name in ("n", "presence_penalty", "frequency_penalty", "logit_bias", "top_k",
                                     "min_p", "repetition_penalty", "min_tokens", "ignore_eos",
                                     "stop_token_ids", "include_stop_str_in_output", "skip_special_tokens",
                                     "stream_options", "stop", "seed", "top_p", "user", "stream")}
    greedy = _complete(server, prompt=prompt, temperature=0)
    given = _complete(server, prompt=prompt, temperature=0, **nulls)
    assert given["choices"] == greedy["choices"]
    defaulted = httpx.post(f"{server}/v1/completions", timeout=60, json={
        "model": "chat", "prompt": prompt, "max_tokens": None, "temperature": 0}).json()
    assert len(defaulted["choices"][0]["token_ids"]) <= 16 and defaulted["choices"][0]["token_ids"] == (
        _ids(server, prompt, temperature=0, max_tokens=16))
    chat = httpx.post(f"{server}/v1/chat/completions", timeout=60, json={
        "model": "chat", "messages": CONVERSATIONS[0], "max_tokens": NEW, "temperature": 0, **nulls})
    assert chat.status_code == 200 and len(chat.json()["choices"]) == 1


#: (endpoint, fields, what the 400's sentence says)
BAD = [
    ("both", {"presence_penalty": 3}, "less than or equal to 2"),
    ("both", {"frequency_penalty": -2.5}, "greater than or equal to -2"),
    ("both", {"top_k": -2}, "greater than or equal to -1"),
    ("both", {"n": 0}, "greater than or equal to 1"),
    ("both", {"n": MAX_CHOICES + 1}, f"less than or equal to {MAX_CHOICES}"),
    ("both", {"min_p": 1.5}, "less than or equal to 1"),
    ("both", {"repetition_penalty": 0}, "greater than or equal to 0.01"),
    ("both", {"logit_bias": {"5": 200}}, "less than or equal to 100"),
    ("both", {"logit_bias": {"cat": 1}}, "not a token id"),
    ("both", {"logit_bias": {"-5": 1}}, "not a token id"),
    ("both", {"logit_bias": {"600": 1}}, "logit_bias names token 600, outside this model's vocabulary"),
    ("both", {"stop_token_ids": [600]}, "stop_token_ids holds 600, outside this model's vocabulary"),
    ("both", {"stop_token_ids": [-1]}, "greater than or equal to 0"),
    ("both", {"min_tokens": NEW + 1}, f"min_tokens ({NEW + 1}) is more than max_tokens ({NEW})"),
    ("both", {"min_tokens": -1}, "greater than or equal to 0"),
    ("both", {"stream_options": {"include_usage": True}}, "only allowed with stream=true"),
    ("both", {"stream": True, "stream_options": {"continuous_usage_stats": True}}, "needs include_usage"),
    ("both", {"spaces_between_special_tokens": False}, "Unknown field 'spaces_between_special_tokens'"),
    ("chat", {"best_of": 2}, "Unknown field 'best_of'"),
    ("chat", {"ignore_eos": True, "response_format": {"type": "json_object"}}, "ignore_eos cannot run"),
]


@pytest.mark.parametrize(("endpoint", "fields", "says"), BAD)
def test_bad_values_get_400_with_a_sentence(server, prompt, endpoint, fields, says):
    bodies = {"/v1/completions": {"prompt": prompt},
              "/v1/chat/completions": {"messages": CONVERSATIONS[0]}}
    for path, body in bodies.items():
        if endpoint == "chat" and path != "/v1/chat/completions":
            continue
        reply = httpx.post(f"{server}{path}", timeout=60,
                           json={"model": "chat", "max_tokens": NEW, **body, **fields})
        assert reply.status_code == 400, reply.text
        message = reply.json()["error"]["message"]
        assert says in message and message.rstrip().endswith("."), message
    assert _ids(server, prompt, temperature=0)  # the server goes on


def test_n_beyond_the_queue_is_refused_and_a_full_queue_takes_no_choice(chat_export, prompt):  # noqa: F811
    """Each choice is a request in the queue: n above --max-queue is 400 with a sentence; a
    queue that fills part-way through cancels the choices it took (503: all or none)."""
    _, om = chat_export
    engine = Engine(om, max_batch=2, max_queue=3, start=False)
    with running(create_app(engine, "chat")) as url:
        body = {"model": "chat", "prompt": prompt, "max_tokens": 2, "n": 4}
        refused = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
        assert refused.status_code == 400 and "--max-queue" in refused.json()["error"]["message"]
        waiting = [engine.submit(prompt, max_new_tokens=2) for _ in range(2)]
        full = httpx.post(f"{url}/v1/completions", json={**body, "n": 2}, timeout=60)
        assert full.status_code == 503 and "max_queue" in full.json()["error"]["message"]
        engine.start()
        assert all(w.result() for w in waiting)
        assert engine.stats.finished.get("cancelled") == 1  # the choice queued before the refusal
        with pytest.raises(openai.BadRequestError, match="--max-queue"):
            _client(url).completions.create(model="chat", prompt=prompt, max_tokens=2, n=4)
        assert len(_client(url).completions.create(model="chat", prompt=prompt, max_tokens=2,
                                                   n=3).choices) == 3
    engine.close()
