"""schemathesis against ``transformer-kit serve``'s own OpenAPI schema (``/openapi.json``), every
operation, on 127.0.0.1 over the chat checkpoint of tests/chat/checkpoint.py: requests that fit
the schema and requests that do not (schemathesis's positive and negative generation). No
answer is a 5xx, none hangs (each must come within :data:`TIMEOUT_S`), every 4xx is an
OpenAI-style JSON error whose message is a sentence, every answer has a status, content type and
body the schema declares (schemathesis's default checks but ``positive_data_acceptance``: the
server refuses, with a sentence, requests the schema cannot rule out, such as a prompt longer
than the context); every operation answered some cases 200 (those reading or deleting a stored
response steered, half of the time, to responses made for them); and after all of it the server
still answers a greedy request with exactly ``OnnxModel.generate``'s tokens. A speech model's
server (Whisper tiny.en's real weights) is fuzzed the same on its two audio operations (whose
cases schemathesis sends with the file as a form field: each stops at the form's check), gets
drawn forms with a real clip uploaded (transcriptions, or 4xx with a sentence), and still
transcribes the clip as ``OnnxModel.transcribe`` after.

One test fuzzes every operation the schema lists, in turn, with ``operation.as_strategy`` under
Hypothesis, then checks the tokens on the same server (``@schema.parametrize`` would need the
schema at import, before the server exists, and its fixture loader,
``schemathesis.pytest.from_fixture``, fails on pytest 9.2: it sets the removed ``Node._nodeid``).

``TRANSFORMER_KIT_FUZZ_EXAMPLES`` sets the examples per operation (default :data:`EXAMPLES`, a
bounded CI run); RELIABILITY.md records a longer run.
"""

from __future__ import annotations

import os
from collections import Counter

import httpx
import numpy as np
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import positive_data_acceptance

from tests.apps.serving.test_chat import _client, chat_export  # noqa: F401
from transformer_kit.apps.serving.http import create_app
from transformer_kit.apps.serving.http import serve_in_thread as running
from transformer_kit.runtime import Engine

#: Examples per operation in the fuzzing phase, each in both modes (fits the schema, does not).
EXAMPLES = int(os.environ.get("TRANSFORMER_KIT_FUZZ_EXAMPLES", "200"))
#: The longest any one answer may take (a hang fails the test).
TIMEOUT_S = 30.0
#: The most tokens a steered case asks for (each request stays cheap).
MAX_NEW = 32
#: The roles steered messages take, in turn.
ROLES = ("system", "user", "assistant", "user")
#: The prompt the server checks exactness on after the fuzzing.
PROMPT = [5, 6, 7, 8, 9]


@pytest.fixture(scope="module")
def server(chat_export):  # noqa: F811
    """(base URL, export): the server in a thread."""
    _, om = chat_export
    engine = Engine(om, max_batch=8, max_queue=64)
    with running(create_app(engine, "chat", max_prompt_tokens=256, max_request_seconds=60)) as url:
        yield url, om
    engine.close()


def _greedy(om, prompt: list[int], new: int) -> list[int]:
    """``OnnxModel.generate``'s greedy tokens for ``prompt`` alone, up to and including an eos id."""
    row = om.generate(np.array([prompt]), attention_mask=np.ones((1, len(prompt))),
                      max_new_tokens=new)[0].tolist()
    eos = om.manifest.eos_id
    return row[:row.index(eos) + 1] if eos in row else row


def _answers_exact_tokens(url: str, om) -> None:
    completion = _client(url).completions.create(model="chat", prompt=PROMPT, max_tokens=16,
                                                 temperature=0)
    assert completion.choices[0].model_extra["token_ids"] == _greedy(om, PROMPT, 16)


def openai_error_with_a_sentence(ctx, response, case) -> None:
    """A 4xx answer is ``{"error": {"message", "type", ...}}`` whose message is a sentence (a
    schemathesis check, passed to each call rather than registered for every schema)."""
    if not 400 <= response.status_code < 500:
        return
    try:
        error = response.json()["error"]
    except (ValueError, KeyError, TypeError) as exc:
        raise AssertionError(f"a {response.status_code} that is not an OpenAI-style error: "
                             f"{response.text[:300]!r}") from exc
    message = error.get("message") if isinstance(error, dict) else None
    assert isinstance(message, str) and len(message.split()) >= 3 and isinstance(error.get("type"), str), (
        f"a {response.status_code} without a sentence: {error!r}")


def _stored_responses(url: str, count: int) -> list[str]:
    """The ids of ``count`` new stored responses (one token each)."""
    client = _client(url)
    return [client.responses.create(model="chat", input=f"Hi {i}", max_output_tokens=1).id
            for i in range(count)]


def _served(drawn: tuple, vocab: int) -> object:
    """A case fitting the schema, half of the time steered past the first refusals into the
    server's deeper paths (else nearly every one stops at a refusal the schema cannot state: an
    unknown model, role or token id, stream_options without stream): the served model, roles
    the template knows with text content, prompt ids inside the ``vocab``, n of 1 or 2, and a
    budget of at most :data:`MAX_NEW` tokens. Still a case that fits."""
    case, steered = drawn
    body = case.body
    if not steered or not isinstance(body, dict):
        return case
    body["model"] = "chat"
    for field in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        if isinstance(body.get(field), (int, float)):
            body[field] = type(body[field])(min(body[field], MAX_NEW))
    prompt = body.get("prompt")
    if isinstance(prompt, list) and all(isinstance(i, int) for i in prompt):
        body["prompt"] = [abs(i) % vocab for i in prompt]
    for i, message in enumerate(body.get("messages") or ()):
        if isinstance(message, dict):
            message["role"] = ROLES[i % len(ROLES)]
            if not isinstance(message.get("content"), str):
                message["content"] = "Hello"
    if isinstance(body.get("n"), int):  # a few choices, each a request of its own
        body["n"] = 1 + abs(body["n"]) % 2
    _steer_sampling(body, vocab)
    if not body.get("stream"):
        body.pop("stream_options", None)
    return case


def _steer_sampling(body: dict, vocab: int) -> None:
    """The sampling fields of a steered case within what the model takes: token ids (a
    logit_bias's keys, stop_token_ids) inside the ``vocab``, min_tokens within the budget."""
    if isinstance(body.get("logit_bias"), dict):
        body["logit_bias"] = {str(int(key) % vocab): value for key, value in body["logit_bias"].items()
                              if key.isascii() and key.isdigit()}
    if isinstance(body.get("stop_token_ids"), list):
        body["stop_token_ids"] = [abs(i) % vocab for i in body["stop_token_ids"] if isinstance(i, int)]
    if isinstance(body.get("min_tokens"), int):
        given = [body[f] for f in ("max_tokens", "max_completion_tokens") if isinstance(body.get(f), int)]
        budget = given[0] if given else 16
        body["min_tokens"] = min(body["min_tokens"], budget)


def _name_stored(drawn: tuple, stored: list[str]) -> tuple:
    """A steered case (as :func:`_served`) that takes a response id in its path names the first
    of ``stored``, which then goes last."""
    case, steered = drawn
    if steered and stored and "response_id" in (case.path_parameters or {}):
        case.path_parameters["response_id"] = stored[0]
        stored.append(stored.pop(0))
    return drawn


def _fuzz(operation, steer, statuses: Counter, examples: int = EXAMPLES) -> None:
    """schemathesis's cases of ``operation``, fitting its schema and not, each sent and checked
    (``steer`` maps a fitting case and a coin to the case sent); ``statuses`` counts the answers
    by status."""
    positive = st.tuples(operation.as_strategy(GenerationMode.POSITIVE), st.booleans()).map(steer)
    cases = st.one_of(positive, operation.as_strategy(GenerationMode.NEGATIVE))

    @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(case=cases)
    def run(case) -> None:
        response = case.call_and_validate(timeout=TIMEOUT_S, additional_checks=[openai_error_with_a_sentence],
                                          excluded_checks=[positive_data_acceptance])
        statuses[response.status_code] += 1

    run()


def test_fuzzed_requests_get_a_status_and_a_sentence_then_exact_tokens(server):
    url, om = server
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    schema.config.update(base_url=url)
    operations = [result.ok() for result in schema.get_all_operations()]
    labels = {operation.label for operation in operations}
    assert labels >= {"POST /v1/completions", "POST /v1/chat/completions", "POST /v1/responses",
                      "GET /v1/responses/{response_id}", "DELETE /v1/responses/{response_id}",
                      "GET /v1/models", "GET /health", "GET /metrics"}
    failures, answered, vocab = {}, {}, om.manifest.src_vocab
    for operation in operations:  # each one fuzzed, whatever the others found
        statuses: Counter = Counter()
        try:
            # made now: the fuzzed POST /v1/responses may have pushed earlier ones out of the store
            stored = _stored_responses(url, 4) if "{response_id}" in operation.path else []
            _fuzz(operation, lambda drawn, stored=stored: _served(_name_stored(drawn, stored), vocab),
                  statuses)
        except Exception as exc:  # schemathesis's failures, each with the request that gave it
            failures[operation.label] = str(exc)
        answered[operation.label] = dict(sorted(statuses.items()))
    print(answered)  # the answers by status, per operation (pytest -s)
    _answers_exact_tokens(url, om)
    assert not failures, "\n\n".join(f"{label}: {what}" for label, what in failures.items())
    assert all(answered[label].get(200) for label in labels), answered  # each reached its work


#: Requests that once got a 500 or a wrong answer, each with what its 400 must say.
REFUSED = [
    *[("/v1/chat/completions", {"chat_template_kwargs": {name: 1}}, f"may not set '{name}'")
      for name in ("messages", "tools", "chat_template", "template", "special_tokens")],
    ("/v1/chat/completions", {"n": -3}, "'n': Input should be greater than or equal to 1"),
    ("/v1/completions", {"max_tokens": -1}, "greater than or equal to 0"),
]


@pytest.mark.parametrize(("path", "fields", "says"), REFUSED)
def test_requests_that_once_failed_get_400_with_a_sentence(server, path, fields, says):
    url, _ = server
    base = ({"prompt": [5, 6]} if path == "/v1/completions"
            else {"messages": [{"role": "user", "content": "Hi"}]})
    reply = httpx.post(f"{url}{path}", json={"model": "chat", "max_tokens": 4, **base, **fields},
                       timeout=TIMEOUT_S)
    assert reply.status_code == 400 and says in reply.json()["error"]["message"]


@pytest.mark.parametrize("temperature", [1e-40, 5e-324])
def test_a_temperature_below_float32s_range_samples_the_greedy_tokens(server, temperature):
    url, om = server  # divided by it, the scores overflowed: NaN probabilities, garbage tokens
    completion = _client(url).completions.create(model="chat", prompt=PROMPT, max_tokens=16,
                                                 temperature=temperature, seed=3)
    assert completion.choices[0].model_extra["token_ids"] == _greedy(om, PROMPT, 16)


#: Examples per audio operation. schemathesis sends the schema's ``file`` as a form field, not
#: an upload, so its cases stop at the form's check; the drawn forms with a real clip below
#: reach the transcription.
SPEECH_EXAMPLES = max(EXAMPLES // 4, 10)
#: Forms drawn with a real clip (each a transcription: a second or so).
FORM_EXAMPLES = max(EXAMPLES // 8, 10)
#: A form field's values: the ones it takes, and any text.
FORM_FIELDS = {
    "language": st.one_of(st.sampled_from(["en", "", "de", "EN"]), st.text(max_size=8)),
    "prompt": st.one_of(st.sampled_from(["Dashwood.", ""]), st.text(max_size=40)),
    "response_format": st.one_of(st.sampled_from(["json", "text", "srt", "verbose_json", "vtt"]),
                                 st.text(max_size=6)),
    "temperature": st.one_of(st.sampled_from(["0", "0.2", "1", "-1", "nan", "1e400"]),
                             st.floats(allow_nan=True).map(str)),
    "stream": st.sampled_from(["true", "false", "yes", "2"]),
    "timestamp_granularities[]": st.sampled_from(["segment", "word", ""]),
    "model": st.sampled_from(["tiny.en", "tiny.en", "whisper-1"]),
}


@pytest.fixture(scope="module")
def speech_server(whisper_tiny_en):
    """(base URL, export, a clip's bytes): a speech model's server in a thread."""
    from pathlib import Path

    from tests.conftest import SPEECH_CLIPS
    from transformer_kit.runtime import OnnxModel

    _, export = whisper_tiny_en
    engine = Engine(OnnxModel(export, providers="cpu"), max_batch=8, max_queue=64)
    clip = sorted(Path(SPEECH_CLIPS).glob("*.wav"))[0].read_bytes()
    with running(create_app(engine, "tiny.en", max_request_seconds=60, max_audio_seconds=60)) as url:
        yield url, export, clip
    engine.close()


def test_fuzzed_audio_requests_get_a_status_and_a_sentence_then_the_transcription(speech_server):
    from transformer_kit.runtime import OnnxModel

    url, export, clip = speech_server
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    schema.config.update(base_url=url)
    operations = [result.ok() for result in schema.get_all_operations()
                  if result.ok().path.startswith("/v1/audio/")]
    assert {operation.label for operation in operations} == {
        "POST /v1/audio/transcriptions", "POST /v1/audio/translations"}
    failures, answered = {}, {}
    for operation in operations:
        statuses: Counter = Counter()
        try:
            _fuzz(operation, lambda drawn: drawn[0], statuses, SPEECH_EXAMPLES)
        except Exception as exc:
            failures[operation.label] = str(exc)
        answered[operation.label] = dict(sorted(statuses.items()))
    print(answered)
    assert not failures, "\n\n".join(f"{label}: {what}" for label, what in failures.items())
    expected = OnnxModel(export, providers="cpu").transcribe(clip).text.strip()
    reply = httpx.post(f"{url}/v1/audio/transcriptions", data={"model": "tiny.en"},
                       files={"file": ("clip.wav", clip)}, timeout=TIMEOUT_S)
    assert reply.status_code == 200 and reply.json()["text"] == expected


def test_drawn_forms_with_a_real_clip_get_a_transcription_or_a_sentence(speech_server):
    """Every form field drawn (the values it takes, and any text) with a real clip as the upload:
    each answer a 200 (JSON, text or a stream the format says) or a 4xx with a sentence, within
    :data:`TIMEOUT_S`; some of them transcriptions."""
    url, _, clip = speech_server
    statuses: Counter = Counter()

    @settings(max_examples=FORM_EXAMPLES, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(form=st.fixed_dictionaries({}, optional=FORM_FIELDS))
    def run(form) -> None:
        form = {"model": "tiny.en", **form}
        path = "/v1/audio/translations" if form.get("prompt") == "" else "/v1/audio/transcriptions"
        response = httpx.post(f"{url}{path}", data=form, files={"file": ("clip.wav", clip)},
                              timeout=TIMEOUT_S)
        statuses[response.status_code] += 1
        assert response.status_code in (200, 400, 404), (form, response.status_code, response.text[:300])
        if response.status_code != 200:
            message = response.json()["error"]["message"]
            assert len(message.split()) >= 3, (form, message)
        elif response.headers["content-type"].startswith("text/event-stream"):
            assert "transcript.text.done" in response.text or '"error"' in response.text, response.text
        elif response.headers["content-type"].startswith("application/json"):
            assert "text" in response.json()

    run()
    print(dict(statuses))
    assert statuses[200] and statuses[400], statuses
