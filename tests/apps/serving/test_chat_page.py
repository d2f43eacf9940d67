"""The chat page at ``/`` of the server, in a real browser: Debian's Chromium driven by Playwright
(no browser of Playwright's own), over the chat checkpoint of tests/chat/checkpoint.py served on
127.0.0.1. A message typed and sent shows the streamed reply, equal to the greedy reply the openai
client gets for the same messages (system prompt, the conversation so far, temperature 0, stop);
HTML in the user's or the model's text is shown literally, never run; with an API key the page
loads without it, shows the server's 401 sentence until the key is given, then sends the key in
the Authorization header only."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletion

import transformer_kit as tk
from tests.chat.checkpoint import write_chat_checkpoint
from transformer_kit.apps.serving.http import create_app
from transformer_kit.apps.serving.http import serve_in_thread as running
from transformer_kit.export import export_onnx
from transformer_kit.runtime import Engine, OnnxModel

CHROMIUM = Path("/usr/bin/chromium")
if not CHROMIUM.exists():
    pytest.skip("the browser test needs Debian's Chromium at /usr/bin/chromium (apt-get install "
                "chromium; .ci/run installs it)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", exc_type=ImportError, reason="the browser test "
                               "needs Playwright (a dev dependency: pip install -e '.[dev]')")
expect = sync_api.expect
#: Chromium headless, offline but for the test's server, in a fresh profile.
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--disable-dev-shm-usage"]  # containers give /dev/shm 64 MB
KEY = "sk-page-0123456789"
MAX_TOKENS = 24
#: Shown literally wherever it appears: it would run script if parsed as HTML.
HOSTILE = '<script>window.__ran = 1</script><img src=x onerror="window.__ran = 2">'


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    folder = write_chat_checkpoint(tmp_path_factory.mktemp("chat-page") / "qwen2")
    export_onnx(tk.from_hf(folder), folder / "onnx")
    engine = Engine(OnnxModel(folder / "onnx", providers="cpu"), max_batch=4, max_queue=16)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def server(engine):
    with running(create_app(engine, "tiny")) as url:
        yield url


@pytest.fixture(scope="module")
def keyed_server(engine):
    with running(create_app(engine, "tiny", api_key=KEY)) as url:
        yield url


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """A Chromium context with a fresh profile of its own."""
    with sync_api.sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            tmp_path_factory.mktemp("chromium-profile"), executable_path=str(CHROMIUM), headless=True,
            args=ARGS)
        yield context
        context.close()


@pytest.fixture
def page(browser):
    """A page of the browser, with the dialogs it opened (none, unless some script ran)."""
    page = browser.new_page()
    page.dialogs = []
    page.on("dialog", lambda dialog: (page.dialogs.append(dialog.message), dialog.dismiss()))
    yield page
    page.close()


def _greedy(url: str, messages: list[dict], key: str = "unused", **options) -> ChatCompletion:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=60)
    return client.chat.completions.create(model="tiny", messages=messages, temperature=0,
                                          max_tokens=MAX_TOKENS, **options)


def _send(page, text: str) -> tuple[object, dict]:
    """Types ``text``, sends it with Enter and waits for the reply's stream to end: (the reply's
    element, the body the page posted)."""
    replies = page.locator(".message.assistant")
    before = replies.count()
    page.locator("#input").fill(text)
    with page.expect_request("**/v1/chat/completions") as request:
        page.locator("#input").press("Enter")
    reply = replies.nth(before)
    expect(reply).to_have_attribute("data-state", "done", timeout=60_000)
    return reply, json.loads(request.value.post_data)


def _stop_inside(text: str) -> str:
    """Three characters from the middle of ``text`` that a stop field can hold (no new line or
    backslash)."""
    for start in range(len(text) // 2, len(text) - 3):
        piece = text[start:start + 3]
        if piece.strip() == piece and not set(piece) & {"\n", "\r", "\\"}:
            return piece
    raise AssertionError(f"no stop string in {text!r}")


def test_a_typed_conversation_streams_the_apis_greedy_replies(server, page):
    page.goto(server)
    expect(page.locator("#model")).to_have_text("tiny")  # read from /v1/models
    system = "Answer in a few words."
    page.locator("#system").fill(system)
    page.locator("#temperature").fill("0")
    page.locator("#max-tokens").fill(str(MAX_TOKENS))
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "Hello there"}]

    reply, sent = _send(page, "Hello there")
    expected = _greedy(server, messages).choices[0]
    assert sent == {"model": "tiny", "messages": messages, "stream": True, "temperature": 0,
                    "max_tokens": MAX_TOKENS}
    assert expected.message.content  # a reply to compare
    assert reply.locator(".text").text_content() == expected.message.content
    assert reply.get_attribute("data-finish") == expected.finish_reason
    cut_note = ["cut at the maximum tokens"] if expected.finish_reason == "length" else []
    assert reply.locator(".finish").all_text_contents() == cut_note

    messages += [{"role": "assistant", "content": expected.message.content},
                 {"role": "user", "content": "Tell me about café culture.\nBriefly."}]
    whole = _greedy(server, messages).choices[0].message.content
    stop = _stop_inside(whole)
    cut = _greedy(server, messages, stop=[stop]).choices[0]
    assert len(cut.message.content) < len(whole) and cut.finish_reason == "stop"
    page.locator("#stop").fill(stop)
    reply, sent = _send(page, messages[-1]["content"])
    assert sent["messages"] == messages and sent["stop"] == [stop]
    assert reply.locator(".text").text_content() == cut.message.content
    assert reply.get_attribute("data-finish") == "stop"
    assert page.locator(".message.user .text").all_text_contents() == ["Hello there", messages[-1]["content"]]


def _events(*deltas: dict) -> str:
    """A chat completion's stream of ``deltas``, as the server sends it."""
    head = {"id": "chatcmpl-page", "object": "chat.completion.chunk", "created": 0, "model": "tiny"}
    chunks = [{**head, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}]}
              for delta in ({"role": "assistant", "content": ""}, *deltas)]
    chunks.append({**head, "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}]})
    return "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in chunks) + "data: [DONE]\n\n"


def _answering(stream: str):
    """A route handler answering with ``stream``."""
    return lambda route: route.fulfill(status=200, headers={"Content-Type": "text/event-stream"},
                                       body=stream)


def test_html_in_the_users_and_the_models_text_is_shown_as_text(server, page):
    page.goto(server)
    expect(page.locator("#model")).to_have_text("tiny")
    page.locator("#max-tokens").fill("4")
    user_reply, sent = _send(page, HOSTILE)  # the real server answers the user's own HTML
    assert sent["messages"][-1] == {"role": "user", "content": HOSTILE}
    assert page.locator(".message.user .text").text_content() == HOSTILE
    # The model's text: a reply whose stream this test writes (no model writes HTML on cue),
    # through the page's own streaming and rendering; the markup is split across events, and
    # the thinking arrives as llama.cpp's reasoning_content, then as vLLM's reasoning.
    thinking = ["<b>bold?</b> <scr", "ipt>window.__ran = 3</script>"]
    answer = ["Look: <img src=x ", 'onerror="window.__ran = 4">', " & <a href=x>a link</a>"]
    for field in ("reasoning_content", "reasoning"):
        stream = _events(*({field: part} for part in thinking), *({"content": part} for part in answer))
        page.route("**/v1/chat/completions", _answering(stream))
        reply, _ = _send(page, f"Think with {field}")
        page.unroute("**/v1/chat/completions")
        assert reply.locator(".text").text_content() == "".join(answer)
        assert reply.locator(".reasoning .thought").text_content() == "".join(thinking)
        assert not reply.locator(".reasoning").evaluate("block => block.open")  # folded once the answer came
    assert user_reply.get_attribute("data-state") == "done"
    messages = page.locator("#messages")
    assert messages.locator("img, script, b, a").count() == 0
    assert page.evaluate("window.__ran") is None and page.dialogs == []


def test_with_a_key_the_page_shows_the_401_sentence_then_sends_the_key(keyed_server, page):
    loaded = page.goto(keyed_server)
    assert loaded.status == 200  # the page itself carries no secret
    assert "script-src 'self'" in loaded.headers["content-security-policy"]
    expect(page.locator("#status")).to_contain_text("needs an API key")
    page.locator("#temperature").fill("0")
    page.locator("#max-tokens").fill(str(MAX_TOKENS))
    refused = httpx.get(f"{keyed_server}/v1/models").json()["error"]["message"]
    page.locator("#input").fill("Hello there")
    page.locator("#send").click()
    error = page.locator(".message.assistant .error")
    expect(error).to_have_text(refused)
    assert "no Authorization header" in refused

    page.locator("#api-key").fill(KEY)
    with page.expect_request("**/v1/chat/completions") as request:
        page.locator("#input").fill("Hello there")
        page.locator("#send").click()
    reply = page.locator(".message.assistant").nth(1)
    expect(reply).to_have_attribute("data-state", "done", timeout=60_000)
    expected = _greedy(keyed_server, [{"role": "user", "content": "Hello there"}], key=KEY)
    assert reply.locator(".text").text_content() == expected.choices[0].message.content
    assert request.value.headers["authorization"] == f"Bearer {KEY}"
    assert KEY not in request.value.url and KEY not in page.url
    kept = page.evaluate("[localStorage.length, sessionStorage.length, document.cookie]")
    assert kept == [0, 0, ""]

