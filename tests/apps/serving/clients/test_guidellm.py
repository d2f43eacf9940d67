"""guidellm driving the server, as a user runs it (its ``run`` command over a scenario file:
the OpenAI HTTP backend, streamed, synthetic prompts of a given length from the checkpoint's
tokenizer, each asking for a given number of output tokens): a synchronous and a concurrent
profile, bounded by a request count; the JSON report read back: every request completed, none
errored, each with the prompt and output tokens asked for. guidellm runs in an environment of
its own (testbed/client_env.py: its click pin clashes with the dev extra's)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from testbed.client_env import GUIDELLM, client_env
from tests.apps.serving.clients.conftest import Served

PROMPT_TOKENS, OUTPUT_TOKENS, REQUESTS = 24, 8, 6


def _prompt_tokens(served: Served, body: dict) -> int:
    """The tokens of the prompt guidellm sent, as the export counts them: the synthetic text
    (its length in transformers' reading of the tokenizer, which splits digits apart), or the
    chat template's turn of it."""
    if "prompt" in body:
        return len(served.model.tokenizer.encode([body["prompt"]], add_special_tokens=False)[0][0])
    (message,) = body["messages"]
    content = message["content"]
    text = content if isinstance(content, str) else "".join(part["text"] for part in content)
    return len(served.prompt_ids([{"role": message["role"], "content": text}]))


@pytest.fixture(scope="module")
def guidellm():
    """guidellm's command in its environment (made once per machine)."""
    return client_env("guidellm", GUIDELLM).parent / "guidellm"


PROFILES = [({"kind": "synchronous"}, "/v1/completions"),
            ({"kind": "concurrent", "streams": [3]}, "/v1/chat/completions")]


@pytest.mark.parametrize(("profile", "endpoint"), PROFILES, ids=["synchronous", "concurrent"])
def test_guidellm_completes_every_request_with_the_tokens_asked(guidellm, chat_server, tmp_path, profile,
                                                                endpoint):
    report = tmp_path / "report.json"
    scenario = {"spec": {
        "backend": {"kind": "openai_http", "target": chat_server.url, "model": chat_server.name,
                    "request_format": endpoint},
        "profile": profile,
        "tokenizer": {"kind": "huggingface_auto", "model": str(chat_server.checkpoint)},
        "data": [{"kind": "synthetic_text", "prompt_tokens": PROMPT_TOKENS, "output_tokens": OUTPUT_TOKENS}],
        "constraints": [{"kind": "max_requests", "count": REQUESTS}],
        "outputs": [{"kind": "json", "path": str(report)}],
        "seed": {"kind": "static", "value": 7}}}
    (tmp_path / "scenario.json").write_text(json.dumps(scenario), encoding="utf-8")
    # one worker process (its default spawns up to 10, each importing torch): 3 streams are
    # asyncio tasks in it
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "COLUMNS": "200",
           "GUIDELLM__MAX_WORKER_PROCESSES": "1"}
    run = subprocess.run([str(guidellm), "run", "-c", str(tmp_path / "scenario.json"),
                          "--disable-console-interactive"], env=env, cwd=tmp_path, capture_output=True,
                         text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (benchmark,) = json.loads(report.read_text(encoding="utf-8"))["benchmarks"]
    requests = benchmark["requests"]
    errors = [r["info"]["error"] for r in requests["errored"]]
    assert errors == [] and requests["incomplete"] == []
    done = requests["successful"]
    assert len(done) == REQUESTS
    for request in done:
        assert request["info"]["status"] == "completed"
        assert request["output_tokens"] == OUTPUT_TOKENS
        body = json.loads(request["request_args"])["body"]
        assert request["prompt_tokens"] == _prompt_tokens(chat_server, body)
    assert len({r["output"] for r in done}) > 1  # different prompts, different replies
