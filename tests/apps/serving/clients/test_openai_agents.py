"""The OpenAI Agents SDK (openai-agents) pointed at the server with its own ``AsyncOpenAI``
client: an agent with a function tool forced on its first turn goes round trip over chat
completions. The call is the export's own forced call, the tool runs with arguments that fit its
schema, the second turn's prompt is the conversation transformers renders with the tool's result,
and the final output is the export's own greedy reply to it."""

from __future__ import annotations

import json
from typing import Annotated

import httpx
import jsonschema
import pytest
from agents import Agent, ModelSettings, RunConfig, Runner, function_tool, set_tracing_disabled
from agents.models.openai_provider import OpenAIProvider
from openai import AsyncOpenAI
from pydantic import BaseModel, Field

from tests.apps.serving.clients.conftest import Served

QUESTION, INSTRUCTIONS = "What is the weather in Paris?", "Answer in a few words."
WEATHER_NOW = "sunny, 21 degrees"


@pytest.fixture(scope="module", autouse=True)
def no_tracing():
    """The SDK would send its traces to OpenAI's platform."""
    set_tracing_disabled(True)
    yield
    set_tracing_disabled(False)


class Sky(BaseModel):
    """The final output the Responses run asks for: a bounded answer, so the reply ends (the
    SDK takes a reply cut at max_output_tokens, status incomplete, for a failure)."""

    sky: str = Field(max_length=8)


def _agent(calls: list[str], output_type: type | None = None) -> Agent:
    @function_tool
    def get_weather(city: Annotated[str, Field(max_length=8)]) -> str:
        """The weather in a city."""
        calls.append(city)
        return WEATHER_NOW

    return Agent(name="weather", instructions=INSTRUCTIONS, tools=[get_weather], output_type=output_type,
                 model_settings=ModelSettings(tool_choice="get_weather", temperature=0, max_tokens=24))


def _run(served: Served, *, responses: bool) -> tuple[object, list[str], list[dict]]:
    """The agent's run over the Responses API or chat completions: (its result, the tool's
    calls, the JSON bodies the SDK sent)."""
    bodies: list[dict] = []

    async def record(request: httpx.Request) -> None:
        bodies.append(json.loads(request.content))

    client = AsyncOpenAI(base_url=served.base_url, api_key="unused", max_retries=0, timeout=120,
                         http_client=httpx.AsyncClient(event_hooks={"request": [record]}))
    calls: list[str] = []
    provider = OpenAIProvider(openai_client=client, use_responses=responses)
    result = Runner.run_sync(_agent(calls, Sky if responses else None), QUESTION, max_turns=3,
                             run_config=RunConfig(model=served.name, model_provider=provider))
    return result, calls, bodies


def _conversation(city: str) -> list[dict]:
    """The conversation of the second turn as a template reads it (the call's arguments an object)."""
    call = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": city}}}
    return [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": QUESTION},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "content": WEATHER_NOW}]


def _checked_call(served: Served, calls: list[str], tools: list[dict]) -> list[dict]:
    """Check the first turn (the one tool, called with arguments that fit its schema, as the
    export's own forced call) and the second turn's prompt; the conversation of that turn."""
    assert [t["function"]["name"] for t in tools] == ["get_weather"]
    jsonschema.validate({"city": calls[0]}, tools[0]["function"]["parameters"])
    first = served.model.chat(_conversation(calls[0])[:2], tools=tools, max_new_tokens=24,
                              tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert json.loads(first["tool_calls"][0]["function"]["arguments"]) == {"city": calls[0]}
    conversation = _conversation(calls[0])
    assert served.prompts[-1] == served.prompt_ids(conversation, tools)
    return conversation


def test_a_function_tool_round_trip_over_chat_completions(chat_server):
    result, calls, bodies = _run(chat_server, responses=False)
    assert len(bodies) == 2 and len(calls) == 1
    tools = bodies[0]["tools"]
    conversation = _checked_call(chat_server, calls, tools)
    expected = chat_server.model.chat(conversation, tools=tools, max_new_tokens=24)
    assert result.final_output == expected["content"]
    usage = result.context_wrapper.usage
    assert usage.requests == 2
    assert usage.input_tokens == len(chat_server.prompts[-2]) + len(chat_server.prompts[-1])


def test_a_function_tool_round_trip_over_the_responses_api(chat_server):
    """The SDK's default API: the same conversation, the same prompts as over chat completions;
    the final output (its ``output_type``, a schema the reply is held to) is the export's own
    reply under that schema."""
    result, calls, bodies = _run(chat_server, responses=True)
    assert len(bodies) == 2 and len(calls) == 1
    tools = [{"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters")}}
             for t in bodies[0]["tools"]]
    conversation = _checked_call(chat_server, calls, tools)
    schema = bodies[1]["text"]["format"]
    expected = chat_server.model.chat(conversation, tools=tools, max_new_tokens=24, response_format={
        "type": "json_schema", "json_schema": {"name": schema["name"], "schema": schema["schema"]}})
    assert result.final_output == Sky.model_validate_json(expected["content"])
