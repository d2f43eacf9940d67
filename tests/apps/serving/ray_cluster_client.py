"""The client side of tests/apps/serving/test_ray_cluster.py, run inside a host's network namespace
(``ip netns exec NS python -m tests.apps.serving.ray_cluster_client COMMAND ...``), where the test
process cannot reach; it answers in JSON on stdout, one line a result.

- ``ask URL KEY CONCURRENCY``: the completions of the JSON list ``[[prompt, max_tokens, stream],
  ...]`` on stdin, ``CONCURRENCY`` at a time: a list of ``{"status", "replica", "tokens"}``.
- ``stream URL KEY PROMPT NEW REPLICA SECONDS``: a stream of ``NEW`` tokens of the prompt (ids,
  comma-separated) answered by ``REPLICA`` (streams answered by another are closed and sent again,
  for at most ``SECONDS``); after its first tokens it writes ``{"streaming": true}`` and waits for a
  line on stdin, then reads the rest: ``{"tokens", "done", "error", "seconds"}`` (done: the stream
  ended with ``[DONE]``; error: what ended it otherwise; seconds: from that line to the end).
- ``replicas GCS``: the deployment's replica actors that Ray's GCS at ``GCS`` (host:port) knows,
  ``{replica id: {"state", "ip", "pid"}}``.
"""

from __future__ import annotations

import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

#: The deployment's actors are named SERVE_REPLICA::APP#DEPLOYMENT#REPLICA_ID.
REPLICA_PREFIX = "SERVE_REPLICA::transformer-kit#CompletionDeployment#"


def _body(prompt: list[int], new: int, stream: bool) -> dict:
    return {"model": "tiny", "prompt": prompt, "max_tokens": new, "temperature": 0, "stream": stream}


def _events(response: httpx.Response):
    """The JSON events of a streamed answer, then None for its ``[DONE]``."""
    for line in response.iter_lines():
        if not line.startswith("data: "):
            continue
        data = line.removeprefix("data: ")
        if data == "[DONE]":
            yield None
            return
        yield json.loads(data)


def _tokens(event: dict) -> list[int]:
    if "error" in event:
        raise RuntimeError(f"an error event: {event['error']}")
    return [t for choice in event["choices"] for t in choice.get("token_ids") or ()]


def ask(url: str, key: str, concurrency: int) -> list[dict]:
    cases = json.load(sys.stdin)
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60) as client:

        def one(case: list) -> dict:
            prompt, new, stream = case
            if not stream:
                answer = client.post("/v1/completions", json=_body(prompt, new, False))
                tokens = answer.json()["choices"][0]["token_ids"] if answer.status_code == 200 else None
                return {"status": answer.status_code, "replica": answer.headers.get("x-replica"),
                        "tokens": tokens}
            with client.stream("POST", "/v1/completions", json=_body(prompt, new, True)) as answer:
                tokens, done = [], False
                for event in _events(answer):
                    if event is None:
                        done = True
                    else:
                        tokens.extend(_tokens(event))
                return {"status": answer.status_code, "replica": answer.headers.get("x-replica"),
                        "tokens": tokens if done else None}

        with ThreadPoolExecutor(concurrency) as clients:
            return list(clients.map(one, cases))


def stream(url: str, key: str, prompt: list[int], new: int, replica: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"},
                      timeout=httpx.Timeout(10, read=300)) as client:
        while True:
            with client.stream("POST", "/v1/completions", json=_body(prompt, new, True)) as answer:
                if answer.headers.get("x-replica") != replica:
                    if time.monotonic() > deadline:
                        raise SystemExit(f"no stream answered by {replica} within {seconds} s")
                    continue
                events, tokens = _events(answer), []
                while len(tokens) < 5:
                    event = next(events)
                    assert event is not None, "the stream ended within its first 5 tokens"
                    tokens.extend(_tokens(event))
                print(json.dumps({"streaming": True}), flush=True)
                sys.stdin.readline()
                start, done, error = time.monotonic(), False, None
                try:
                    for event in events:
                        if event is None:
                            done = True
                        else:
                            tokens.extend(_tokens(event))
                except Exception as exc:  # what ended the stream is the result
                    error = f"{type(exc).__name__}: {exc}"
                print(json.dumps({"tokens": tokens, "done": done, "error": error,
                                  "seconds": time.monotonic() - start}), flush=True)
                return


def replicas(gcs: str) -> dict:
    import ray
    from ray._private.state import actors

    ray.init(address=gcs, log_to_driver=False, logging_level="ERROR")
    try:
        return {info["Name"].removeprefix(REPLICA_PREFIX):
                {"state": info["State"], "ip": info["Address"]["IPAddress"], "pid": info["Pid"]}
                for info in actors().values() if (info.get("Name") or "").startswith(REPLICA_PREFIX)}
    finally:
        ray.shutdown()


def main(command: str, *args: str) -> None:
    if command == "ask":
        url, key, concurrency = args
        print(json.dumps(ask(url, key, int(concurrency))), flush=True)
    elif command == "stream":
        url, key, prompt, new, replica, seconds = args
        stream(url, key, [int(t) for t in prompt.split(",")], int(new), replica, float(seconds))
    elif command == "replicas":
        print(json.dumps(replicas(*args)), flush=True)
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    main(*sys.argv[1:])
