"""LiteLLM's ``completion`` pointed at the server as an OpenAI-compatible provider
(``model="openai/<name>"``, ``api_base``): whole and streamed, the reply is the export's own
greedy reply and the usage its token counts."""

from __future__ import annotations

import pytest

from tests.apps.serving.clients.conftest import Served

MESSAGES = [{"role": "system", "content": "Answer in a few words."},
            {"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def litellm():
    """litellm, imported with its model cost map read from the package (it fetches it from the
    network at import otherwise)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        import litellm

        yield litellm


def _ask(litellm, served: Served, **options):
    return litellm.completion(model=f"openai/{served.name}", api_base=served.base_url, api_key="unused",
                              messages=MESSAGES, max_tokens=12, temperature=0, num_retries=0,
                              timeout=120, **options)


def test_a_completion_is_the_greedy_reply_with_its_usage(litellm, chat_server):
    expected = chat_server.reply(MESSAGES, 12)
    response = _ask(litellm, chat_server)
    choice = response.choices[0]
    assert choice.message.content == expected["content"]
    assert choice.finish_reason == expected["finish_reason"] == "length"
    usage = response.usage
    assert (usage.prompt_tokens, usage.completion_tokens) == (expected["prompt_tokens"], 12)
    assert usage.total_tokens == expected["prompt_tokens"] + 12


def test_a_stream_joins_to_the_reply_and_ends_with_the_usage(litellm, chat_server):
    expected = chat_server.reply(MESSAGES, 12)
    chunks = list(_ask(litellm, chat_server, stream=True, stream_options={"include_usage": True}))
    assert len(chunks) > 2  # token by token, not one piece
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected["content"]
    whole = litellm.stream_chunk_builder(chunks, messages=MESSAGES)
    assert whole.choices[0].message.content == expected["content"]
    assert whole.choices[0].finish_reason == "length"
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (expected["prompt_tokens"], 12)
