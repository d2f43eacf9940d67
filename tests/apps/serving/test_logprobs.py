"""Log probabilities on the server, with the official ``openai`` client, over the random Qwen2
chat checkpoint of tests/chat/checkpoint.py: chat's ``logprobs.content`` and the completions'
legacy ``logprobs`` (with ``echo``, as lm-evaluation-harness scores with them) and vLLM's
``prompt_logprobs`` equal transformers' log-softmax of the same checkpoint within 1e-4, whole
and streamed; top_logprobs are sorted, the chosen token among them when greedy."""

from __future__ import annotations

import numpy as np
import openai
import pytest
import torch
import transformers as hf

import transformer_kit as tk
from tests.chat.checkpoint import write_chat_checkpoint
from transformer_kit.apps.serving.http import create_app
from transformer_kit.apps.serving.http import serve_in_thread as running
from transformer_kit.export import export_onnx
from transformer_kit.runtime import Engine, OnnxModel

QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """(client, transformers' model, its tokenizer, the export)."""
    folder = write_chat_checkpoint(tmp_path_factory.mktemp("logprobs") / "qwen2")
    export_onnx(tk.from_hf(folder), folder / "onnx")
    om = OnnxModel(folder / "onnx", providers="cpu")
    engine = Engine(om)
    model = hf.AutoModelForCausalLM.from_pretrained(folder).eval()
    with running(create_app(engine, "m")) as url:
        yield (openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=120), model,
               hf.AutoTokenizer.from_pretrained(folder), om)
    engine.close()


def _reference(model, ids: list[int], temperature: float = 1.0) -> np.ndarray:
    """transformers' log-softmax (len(ids), vocab) at every position of ``ids``."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits / temperature, -1).numpy()


def _chat_ids(tokenizer, messages) -> list[int]:
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False).input_ids


@pytest.mark.parametrize("stream", [False, True])
def test_chat_logprobs_equal_transformers(setup, stream):
    client, model, tokenizer, _ = setup
    asked = dict(model="m", messages=QUESTION, max_tokens=12, temperature=0, logprobs=True,
                 top_logprobs=3)
    if stream:
        content, text = [], ""
        for chunk in client.chat.completions.create(stream=True, **asked):
            if chunk.choices and chunk.choices[0].logprobs is not None:
                content.extend(chunk.choices[0].logprobs.content)
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
    else:
        choice = client.chat.completions.create(**asked).choices[0]
        content, text = choice.logprobs.content, choice.message.content
    prompt = _chat_ids(tokenizer, QUESTION)
    with torch.no_grad():  # transformers' greedy reply, whose tokens the kit's are
        out = model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False)
    ids = out[0, len(prompt):].tolist()
    assert len(content) == len(ids)
    assert b"".join(bytes(e.bytes) for e in content).decode() == tokenizer.decode(ids)
    assert tokenizer.decode(ids, skip_special_tokens=True) == text
    reference = _reference(model, prompt + ids)[len(prompt) - 1:]
    for step, (entry, token) in enumerate(zip(content, ids, strict=True)):
        expected = reference[step]
        assert entry.logprob == pytest.approx(float(expected[token]), abs=1e-4)
        tops = [t.logprob for t in entry.top_logprobs]
        assert tops == sorted(tops, reverse=True) and len(tops) == 3
        assert entry.top_logprobs[0].token == entry.token  # greedy: the chosen one is the first
        np.testing.assert_allclose(tops, np.sort(expected)[::-1][:3], atol=1e-4)


def test_completions_echo_scores_a_prompt_as_lm_eval_does(setup):
    """lm-eval's loglikelihood request: token ids, echo, logprobs 1, max_tokens 1, several
    prompts in one request: each choice's prompt reports are transformers' log-softmax."""
    client, model, tokenizer, _ = setup
    prompts = [tokenizer("The capital of France is Paris").input_ids,
               tokenizer("Two plus two").input_ids]
    answer = client.completions.create(model="m", prompt=prompts, echo=True, logprobs=1, max_tokens=1,
                                       temperature=0)
    assert [c.index for c in answer.choices] == [0, 1]
    for choice, ids in zip(answer.choices, prompts, strict=True):
        reports = choice.logprobs
        assert reports.token_logprobs[0] is None and len(reports.token_logprobs) == len(ids) + 1
        reference = _reference(model, ids)
        expected = [float(reference[i, ids[i + 1]]) for i in range(len(ids) - 1)]
        np.testing.assert_allclose(reports.token_logprobs[1:len(ids)], expected, atol=1e-4)
        generated = int(np.argmax(reference[-1]))
        assert choice.model_extra["token_ids"] == [generated]
        assert reports.token_logprobs[-1] == pytest.approx(float(reference[-1, generated]), abs=1e-4)
        for token_logprob, top in zip(reports.token_logprobs[1:], reports.top_logprobs[1:], strict=True):
            assert token_logprob in top.values() and max(top.values()) >= token_logprob
        assert choice.text.startswith(tokenizer.decode(ids))
        assert reports.text_offset[0] == 0 and reports.text_offset == sorted(reports.text_offset)
    assert answer.usage.prompt_tokens == sum(map(len, prompts)) and answer.usage.completion_tokens == 2


def test_max_tokens_zero_answers_the_prompt_and_prompt_logprobs(setup):
    client, model, tokenizer, _ = setup
    text = "Hello there, café"
    answer = client.completions.create(model="m", prompt=text, echo=True, logprobs=2, max_tokens=0,
                                       extra_body={"prompt_logprobs": 2})
    choice = answer.choices[0]
    ids = tokenizer(text).input_ids
    assert choice.text == text and choice.finish_reason == "length"
    assert choice.model_extra["token_ids"] == [] and answer.usage.completion_tokens == 0
    reference = _reference(model, ids)
    vllm = choice.model_extra["prompt_logprobs"]
    assert vllm[0] is None and choice.model_extra["prompt_token_ids"] == ids
    for i, position in enumerate(vllm[1:]):
        given = position[str(ids[i + 1])]
        assert given["logprob"] == pytest.approx(float(reference[i, ids[i + 1]]), abs=1e-4)
        assert given["rank"] == int((reference[i] > reference[i, ids[i + 1]]).sum()) + 1
        best = int(np.argmax(reference[i]))
        assert position[str(best)]["rank"] == 1


def test_streamed_completion_logprobs_equal_whole(setup):
    client, _, _, _ = setup
    asked = dict(model="m", prompt="Once upon a time", max_tokens=8, temperature=0, logprobs=3,
                 echo=True)
    whole = client.completions.create(**asked).choices[0]
    tokens, logprobs, text = [], [], ""
    for chunk in client.completions.create(stream=True, **asked):
        choice = chunk.choices[0]
        text += choice.text
        if choice.logprobs is not None:
            tokens += choice.logprobs.tokens
            logprobs += choice.logprobs.token_logprobs
    assert text == whole.text
    assert tokens == whole.logprobs.tokens and logprobs == whole.logprobs.token_logprobs


def test_processed_logprobs_are_of_the_sampled_distribution(setup):
    """logprobs_mode "processed" reports the log-softmax of the logits over the temperature."""
    client, model, tokenizer, _ = setup
    choice = client.chat.completions.create(
        model="m", messages=QUESTION, max_tokens=4, temperature=0.5, seed=3, logprobs=True,
        extra_body={"logprobs_mode": "processed"}).choices[0]
    prompt = _chat_ids(tokenizer, QUESTION)
    ids = tokenizer("".join(e.token for e in choice.logprobs.content), add_special_tokens=False).input_ids
    reference = _reference(model, prompt + ids, temperature=0.5)[len(prompt) - 1:]
    for step, (entry, token) in enumerate(zip(choice.logprobs.content, ids, strict=False)):
        assert entry.logprob == pytest.approx(float(reference[step, token]), abs=1e-4)


@pytest.mark.parametrize(("endpoint", "body", "says"), [
    ("chat", {"top_logprobs": 2}, "needs logprobs"),
    ("chat", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("completions", {"logprobs": 6}, "logprobs"),
    ("completions", {"prompt_logprobs": -1}, "prompt_logprobs"),
])
def test_bad_logprobs_get_a_sentence(setup, endpoint, body, says):
    client, _, _, _ = setup
    with pytest.raises(openai.BadRequestError, match=says):
        if endpoint == "chat":
            client.chat.completions.create(model="m", messages=QUESTION, max_tokens=2, extra_body=body)
        else:
            client.completions.create(model="m", prompt="Hi", max_tokens=2, extra_body=body)
    assert client.completions.create(model="m", prompt="Hi", max_tokens=1).choices[0].text is not None


def test_python_chat_and_prompt_logprobs_equal_transformers(setup):
    """In Python: ``OnnxModel.chat(..., logprobs=k)`` gives the message its tokens' reports, and
    ``OnnxModel.prompt_logprobs`` a prompt's, both transformers' log-softmax."""
    _, model, tokenizer, om = setup
    message = om.chat(QUESTION, max_new_tokens=6, logprobs=2)
    prompt = _chat_ids(tokenizer, QUESTION)
    ids = [r.token_id for r in message["logprobs"]]
    reference = _reference(model, prompt + ids)[len(prompt) - 1:]
    np.testing.assert_allclose([r.logprob for r in message["logprobs"]],
                               reference[np.arange(len(ids)), ids], atol=1e-4)
    reports = om.prompt_logprobs(prompt, 1)
    reference = _reference(model, prompt)
    assert reports[0] is None
    np.testing.assert_allclose([r.logprob for r in reports[1:]],
                               reference[np.arange(len(prompt) - 1), prompt[1:]], atol=1e-4)
    assert all(r.top[0][0] == int(np.argmax(reference[i])) for i, r in enumerate(reports[1:]))


@pytest.mark.parametrize("stream", [False, True])
def test_responses_logprobs_are_chats(setup, stream):
    """``include: ["message.output_text.logprobs"]`` with ``top_logprobs``: the output_text's
    (and the deltas') reports are chat's for the same greedy reply."""
    client, _, _, _ = setup
    chat = client.chat.completions.create(model="m", messages=QUESTION, max_tokens=8, temperature=0,
                                          logprobs=True, top_logprobs=2).choices[0].logprobs.content
    asked = dict(model="m", input=QUESTION, max_output_tokens=8, temperature=0, top_logprobs=2,
                 include=["message.output_text.logprobs"])
    if stream:
        events = list(client.responses.create(stream=True, **asked))
        deltas = [e for event in events if event.type == "response.output_text.delta" for e in event.logprobs]
        done = next(e for e in events if e.type == "response.output_text.done").logprobs
        assert [d.token for d in deltas] == [d.token for d in done]
    else:
        done = client.responses.create(**asked).output[0].content[0].logprobs
    assert [(e.token, e.logprob) for e in done] == [(e.token, e.logprob) for e in chat]
    def tops(entries):
        return [[t.token for t in e.top_logprobs] for e in entries]

    assert tops(done) == tops(chat)
