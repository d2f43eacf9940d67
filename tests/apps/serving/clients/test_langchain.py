"""LangChain's OpenAI integration (langchain-openai) pointed at the server with ``base_url``:
``ChatOpenAI``'s invoke and stream (with the usage) give the export's own greedy reply and its
token counts; ``with_structured_output`` over a JSON schema gives the object the export writes
under that schema; a tool forced by name (``bind_tools(..., tool_choice=NAME)``) comes back as a
call whose arguments fit the tool's schema; ``OpenAIEmbeddings`` with
``check_embedding_ctx_length=False`` (text, not tiktoken's ids) gets sentence-transformers'
vectors."""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest
from langchain_openai import ChatOpenAI, OpenAIEmbeddings

from tests.apps.serving.clients.conftest import WEATHER, Served

MESSAGES = [("system", "Answer in a few words."), ("human", "Tell me about café culture.")]
AS_OPENAI = [{"role": "system", "content": "Answer in a few words."},
             {"role": "user", "content": "Tell me about café culture."}]
CITY = {"title": "City", "description": "A city and its weather.", "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 10},
                       "sky": {"enum": ["sunny", "rain", "snow"]},
                       "degrees": {"type": "integer", "minimum": -40, "maximum": 50}},
        "required": ["name", "sky", "degrees"], "additionalProperties": False}
TEXTS = ["the quick brown fox jumps over the lazy dog", "paris is the capital of france", "cats"]


def _chat(served: Served, **options) -> ChatOpenAI:
    return ChatOpenAI(model=served.name, base_url=served.base_url, api_key="unused", temperature=0,
                      max_retries=0, timeout=120, **{"max_tokens": 12, **options})


def test_invoke_is_the_greedy_reply_with_its_usage(chat_server):
    expected = chat_server.reply(AS_OPENAI, 12)
    message = _chat(chat_server).invoke(MESSAGES)
    assert message.content == expected["content"]
    assert message.response_metadata["finish_reason"] == expected["finish_reason"] == "length"
    prompt = expected["prompt_tokens"]
    usage = message.usage_metadata
    assert (usage["input_tokens"], usage["output_tokens"], usage["total_tokens"]) == (prompt, 12, prompt + 12)


def test_a_stream_joins_to_the_reply_and_carries_the_usage(chat_server):
    expected = chat_server.reply(AS_OPENAI, 12)
    chunks = list(_chat(chat_server, stream_usage=True).stream(MESSAGES))
    assert len(chunks) > 2
    whole = chunks[0]
    for chunk in chunks[1:]:
        whole += chunk
    assert whole.content == expected["content"]
    prompt = expected["prompt_tokens"]
    assert (whole.usage_metadata["input_tokens"], whole.usage_metadata["output_tokens"]) == (prompt, 12)
    assert whole.usage_metadata["total_tokens"] == prompt + 12


def test_structured_output_is_the_object_the_export_writes_under_the_schema(chat_server):
    structured = _chat(chat_server, max_tokens=48).with_structured_output(CITY, method="json_schema")
    answer = structured.invoke(MESSAGES)
    jsonschema.validate(answer, CITY)
    fmt = {"type": "json_schema", "json_schema": {"name": "City", "schema": CITY}}
    expected = chat_server.reply(AS_OPENAI, 48, response_format=fmt)
    assert answer == json.loads(expected["content"])


def _forced_call(served: Served) -> dict:
    """The one tool call of a reply forced to call get_weather, its arguments checked."""
    forced = _chat(served, max_tokens=48).bind_tools([WEATHER], tool_choice="get_weather")
    message = forced.invoke([("human", "What is the weather in Paris?")])
    assert message.response_metadata["finish_reason"] == "tool_calls"
    (call,) = message.tool_calls
    assert call["name"] == "get_weather" and call["id"]
    jsonschema.validate(call["args"], WEATHER["function"]["parameters"])
    return call


def test_a_tool_forced_by_name_is_called_with_arguments_that_fit(chat_server):
    call = _forced_call(chat_server)
    expected = chat_server.model.chat([{"role": "user", "content": "What is the weather in Paris?"}],
                                      tools=[WEATHER], tool_choice={"type": "function",
                                                                    "function": {"name": "get_weather"}},
                                      max_new_tokens=48)
    assert [c["function"]["name"] for c in expected["tool_calls"]] == ["get_weather"]
    assert call["args"] == json.loads(expected["tool_calls"][0]["function"]["arguments"])


def test_a_tool_forced_by_name_on_a_template_that_renders_no_tools(smollm_server):
    """SmolLM2's template has no place for tools: the forced call is the server's to make."""
    _forced_call(smollm_server)


@pytest.fixture(scope="module")
def embeddings(embedding_server):
    url, st = embedding_server
    return OpenAIEmbeddings(model="tiny-embed", base_url=f"{url}/v1", api_key="unused",
                            check_embedding_ctx_length=False, max_retries=0), st


def test_embeddings_sent_as_text_are_sentence_transformers_vectors(embeddings):
    client, st = embeddings
    np.testing.assert_allclose(client.embed_documents(TEXTS), st.encode(TEXTS), atol=1e-5)
    np.testing.assert_allclose(client.embed_query(TEXTS[1]), st.encode(TEXTS[1]), atol=1e-5)
