"""An agent loop: where a model client plugs into codemode, with the model's turns scripted.

Run from the repository's root: `.venv/bin/python -m examples.agent_loop` (OpenAI Responses
API shapes), or `.venv/bin/python -m examples.agent_loop --api anthropic` (Anthropic Messages
API shapes).

The loop is what a real agent does:
1. hand the model the conversation and the `exec` and `wait` tools (`code_mode.tool_specs(api)`);
2. run each tool call the model makes with `code_mode.call(name, call_id, payload)`;
3. append each result to the conversation (`output.to_openai(call_id)`, or
   `output.to_anthropic(tool_use_id)` in a user message);
4. repeat until the model answers without calling a tool.

`ScriptedOpenAI` and `ScriptedAnthropic` stand for the model clients so that the example runs
offline: they answer with the same shapes as the SDKs' `client.responses.create(...)` and
`client.messages.create(...)`, and their "model" reads the tool results it gets, like a model
would (it learns the cell id from `Script running with cell ID 1`). To use a real model, replace
the client's `create` by the call in its docstring; the loops stay as they are.
"""

from __future__ import annotations

import argparse
import json
import re
from typing import Any

import trio

import codemode
from codemode.model import CodeMode, ToolOutput
from examples.weather_tools import toolbox

QUESTION = "Which city is warmest today, and what is its forecast?"

EXEC_CODE = """\
// @exec: {"yield_time_ms": 5000}
const cities = await tools.list_cities();
const readings = await Promise.all(cities.map((city) => tools.current_temperature({ city })));
readings.sort((a, b) => b.degrees - a.degrees);
text(`warmest: ${readings[0].city} at ${readings[0].degrees} C`);
yield_control(); // hand the first finding over while the forecast loads
const days = await tools.forecast({ city: readings[0].city, days: 3 });
text(days.map((d) => `day ${d.day}: ${d.sky}, ${d.low} to ${d.high} C`).join("\\n"));
"""


def next_step(tool_results: list[str]) -> tuple[str, Any]:
    """The scripted model's decision, from the texts of the tool results it has seen so far.

    Returns:
        `("exec", code)`, `("wait", arguments)` or `("answer", text)`.
    """
    if not tool_results:
        return "exec", EXEC_CODE
    running = re.match(r"Script running with cell ID (\S+)", tool_results[-1])
    if running:
        return "wait", {"cell_id": running.group(1), "yield_time_ms": 5000}
    findings = [line for text in tool_results for line in text.splitlines()[3:] if line]
    return "answer", "Here is what I found:\n" + "\n".join(findings)


class ScriptedOpenAI:
    """Stands for `openai.AsyncOpenAI()`; `create` answers like `client.responses.create`.

    With the SDK:

        response = await client.responses.create(model=MODEL, tools=tools, input=conversation)
        return [item.model_dump(exclude_none=True) for item in response.output]
    """

    def __init__(self) -> None:
        self._calls = 0

    async def create(self, tools: list[dict[str, Any]], conversation: list[Any]) -> list[Any]:
        assert [tool["name"] for tool in tools] == ["exec", "wait"]
        results = [
            _texts(item["output"])
            for item in conversation
            if isinstance(item, dict) and item.get("type", "").endswith("call_output")
        ]
        action, value = next_step(results)
        self._calls += 1
        n = self._calls
        if action == "exec":
            call = {"type": "custom_tool_call", "id": f"ctc_{n}", "input": value}
        elif action == "wait":
            arguments = json.dumps(value)
            call = {"type": "function_call", "id": f"fc_{n}", "arguments": arguments}
        else:
            text = {"type": "output_text", "text": value, "annotations": []}
            message = {"type": "message", "id": f"msg_{n}", "role": "assistant", "content": [text]}
            return [{**message, "status": "completed"}]
        return [{**call, "call_id": f"call_{n}", "name": action}]


class ScriptedAnthropic:
    """Stands for `anthropic.AsyncAnthropic()`; `create` answers like `client.messages.create`.

    With the SDK:

        message = await client.messages.create(
            model=MODEL, max_tokens=4096, tools=tools, messages=conversation
        )
        return {"role": "assistant", "content": [b.model_dump() for b in message.content]}
    """

    def __init__(self) -> None:
        self._calls = 0

    async def create(
        self, tools: list[dict[str, Any]], conversation: list[dict[str, Any]]
    ) -> dict[str, Any]:
        assert [tool["name"] for tool in tools] == ["exec", "wait"]
        results = [
            _texts(block["content"])
            for message in conversation
            if isinstance(message["content"], list)
            for block in message["content"]
            if block["type"] == "tool_result"
        ]
        action, value = next_step(results)
        self._calls += 1
        if action == "answer":
            return {"role": "assistant", "content": [{"type": "text", "text": value}]}
        arguments = {"code": value} if action == "exec" else value
        use = {"type": "tool_use", "id": f"toolu_{self._calls}", "name": action, "input": arguments}
        return {"role": "assistant", "content": [use]}


def _texts(blocks: list[dict[str, Any]]) -> str:
    return "\n".join(block["text"] for block in blocks if block.get("text") is not None)


def show(label: str, output: ToolOutput) -> None:
    print(f"codemode -> {label} ({output.status}):")
    for line in output.text.splitlines():
        if line:
            print(f"    {line}")


async def openai_loop(code_mode: CodeMode, client: ScriptedOpenAI, conversation: list[Any]) -> str:
    """The agent loop with the Responses API.

    Args:
        code_mode: runs the model's `exec` and `wait` calls.
        client: the model.
        conversation: the input items so far; the loop appends the model's output items and
            the tools' results.

    Returns:
        The model's final answer.
    """
    tools = code_mode.tool_specs("openai")
    while True:
        items = await client.create(tools, conversation)
        conversation += items
        calls = [item for item in items if item["type"] in {"custom_tool_call", "function_call"}]
        if not calls:
            return "\n".join(
                part["text"] for item in items for part in item["content"] if "text" in part
            )
        for call in calls:
            payload = call["input"] if call["type"] == "custom_tool_call" else call["arguments"]
            print(f"model -> {call['name']} ({call['call_id']})")
            output = await code_mode.call(call["name"], call["call_id"], payload)
            show(call["name"], output)
            conversation.append(output.to_openai(call["call_id"]))


async def anthropic_loop(
    code_mode: CodeMode, client: ScriptedAnthropic, conversation: list[dict[str, Any]]
) -> str:
    """The agent loop with the Messages API.

    Args:
        code_mode: runs the model's `exec` and `wait` calls.
        client: the model.
        conversation: the messages so far; the loop appends the model's messages and user
            messages with the tools' results.

    Returns:
        The model's final answer.
    """
    tools = code_mode.tool_specs("anthropic")
    while True:
        message = await client.create(tools, conversation)
        conversation.append(message)
        uses = [block for block in message["content"] if block["type"] == "tool_use"]
        if not uses:
            return "\n".join(block["text"] for block in message["content"] if "text" in block)
        results = []
        for use in uses:
            print(f"model -> {use['name']} ({use['id']})")
            output = await code_mode.call(use["name"], use["id"], use["input"])
            show(use["name"], output)
            results.append(output.to_anthropic(use["id"]))
        conversation.append({"role": "user", "content": results})


async def main(api: str) -> None:
    async with codemode.open_process_provider() as provider:
        session = await provider.create_session()
        code_mode = CodeMode(session, toolbox, toolbox.definitions())
        print(f"user: {QUESTION}")
        conversation: list[Any] = [{"role": "user", "content": QUESTION}]
        if api == "openai":
            answer = await openai_loop(code_mode, ScriptedOpenAI(), conversation)
        else:
            answer = await anthropic_loop(code_mode, ScriptedAnthropic(), conversation)
        print(f"model: {answer}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--api", choices=["openai", "anthropic"], default="openai")
    trio.run(main, parser.parse_args().api)
