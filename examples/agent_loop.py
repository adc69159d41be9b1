"""An agent loop: a model, through its SDK's async client, in code mode over codemode.

Run from the repository's root. Against a real model, with the SDK's own API key variable
(`OPENAI_API_KEY`, `ANTHROPIC_API_KEY`) set:

    .venv/bin/python -m examples.agent_loop --model gpt-5                          # Responses API
    .venv/bin/python -m examples.agent_loop --api anthropic --model claude-sonnet-4-5
    .venv/bin/python -m examples.agent_loop --base-url http://localhost:8000/v1   # any server

Offline, against the scripted model of `examples/scripted_model.py` (started on a free local
port; the same wire formats, so the same client code):

    .venv/bin/python -m examples.agent_loop --scripted [--api anthropic] [--stream]

The loop is what a real agent does:
1. hand the model the conversation and the `exec` and `wait` tools (`code_mode.tool_specs(api)`);
2. run each tool call the model makes with `code_mode.call(name, call_id, payload)`;
3. append each result to the conversation (`output.to_openai(call_id)`, or
   `output.to_anthropic(tool_use_id)` in a user message);
4. repeat until the model answers without calling a tool.

With `--stream` the model's text is printed as it arrives, and each tool call runs as soon as
the model finished writing it, while the rest of the response streams in. The SDK clients run
on trio here (their HTTP stack runs on anyio); an asyncio application uses `codemode.aio`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import AsyncIterable, AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import trio
from anthropic import AsyncAnthropic
from anthropic.types import Message
from openai import AsyncOpenAI

import codemode
from codemode.model import CodeMode, ToolOutput
from examples import scripted_model
from examples.weather_tools import toolbox

QUESTION = "Which city is warmest today, and what is its forecast?"

T = TypeVar("T")


@asynccontextmanager
async def each_of(stream: AsyncIterable[T]) -> AsyncIterator[AsyncIterator[T]]:
    """Iterate a stream's events, closing the iteration (an async generator) at the end of the
    block, also when the loop is cancelled: trio asks it of async generators."""
    iterator = aiter(stream)
    try:
        yield iterator
    finally:
        aclose = getattr(iterator, "aclose", None)
        if aclose is not None:
            await aclose()


def show(label: str, output: ToolOutput) -> None:
    print(f"codemode -> {label} ({output.status}):")
    for line in output.text.splitlines():
        if line:
            print(f"    {line}")


async def openai_loop(
    code_mode: CodeMode,
    client: AsyncOpenAI,
    model: str,
    conversation: list[Any],
    *,
    stream: bool = False,
) -> str:
    """The agent loop with the Responses API (`exec` is a custom tool, `wait` a function).

    Args:
        code_mode: runs the model's `exec` and `wait` calls.
        client: the model's client.
        model: the model's name.
        conversation: the input items so far; the loop appends the model's output items and
            the tools' results.
        stream: stream each response (`stream=True`): print its text as it arrives, run each
            tool call as soon as its item is done.

    Returns:
        The model's final answer.
    """
    tools: Any = code_mode.tool_specs("openai")
    while True:
        results: list[dict[str, Any]] = []
        if stream:
            events = await client.responses.create(
                model=model, tools=tools, input=conversation, stream=True
            )
            output = None
            answering = False
            async with events, each_of(events) as each_event:
                async for event in each_event:
                    if event.type == "response.output_text.delta":
                        if not answering:
                            answering = True
                            _start_answer()
                        print(event.delta, end="", flush=True)
                    elif event.type == "response.output_item.done":
                        results += await _run_openai_calls(code_mode, [event.item])
                    elif event.type == "response.completed":
                        output = event.response.output
            assert output is not None, "the stream ended before response.completed"
        else:
            response = await client.responses.create(model=model, tools=tools, input=conversation)
            output = response.output
            results = await _run_openai_calls(code_mode, output)
        conversation += [item.model_dump(exclude_none=True) for item in output]
        if not results:
            answer = "".join(
                part.text
                for item in output
                if item.type == "message"
                for part in item.content
                if part.type == "output_text"
            )
            if not stream:
                _start_answer()
                print(answer, end="")
            print()
            return answer
        conversation += results


async def _run_openai_calls(code_mode: CodeMode, items: list[Any]) -> list[dict[str, Any]]:
    results = []
    for item in items:
        if item.type not in {"custom_tool_call", "function_call"}:
            continue
        payload = item.input if item.type == "custom_tool_call" else item.arguments
        print(f"model -> {item.name} ({item.call_id})")
        output = await code_mode.call(item.name, item.call_id, payload)
        show(item.name, output)
        results.append(output.to_openai(item.call_id))
    return results


async def anthropic_loop(
    code_mode: CodeMode,
    client: AsyncAnthropic,
    model: str,
    conversation: list[Any],
    *,
    stream: bool = False,
) -> str:
    """The agent loop with the Messages API (both tools take JSON: `exec` gets `{"code": ...}`).

    Args:
        code_mode: runs the model's `exec` and `wait` calls.
        client: the model's client.
        model: the model's name.
        conversation: the messages so far; the loop appends the model's messages and user
            messages with the tools' results.
        stream: stream each message (`client.messages.stream`): print its text as it arrives,
            run each tool use as soon as its block is complete.

    Returns:
        The model's final answer.
    """
    tools: Any = code_mode.tool_specs("anthropic")
    while True:
        results: list[dict[str, Any]] = []
        message: Message
        if stream:
            async with client.messages.stream(
                model=model, max_tokens=4096, tools=tools, messages=conversation
            ) as events:
                answering = False
                async with each_of(events) as each_event:
                    async for event in each_event:
                        if event.type == "text":
                            if not answering:
                                answering = True
                                _start_answer()
                            print(event.text, end="", flush=True)
                        elif event.type == "content_block_stop":
                            results += await _run_anthropic_uses(code_mode, [event.content_block])
                message = await events.get_final_message()
        else:
            message = await client.messages.create(
                model=model, max_tokens=4096, tools=tools, messages=conversation
            )
            results = await _run_anthropic_uses(code_mode, message.content)
        conversation.append({"role": "assistant", "content": message.content})
        if not results:
            answer = "".join(block.text for block in message.content if block.type == "text")
            if not stream:
                _start_answer()
                print(answer, end="")
            print()
            return answer
        conversation.append({"role": "user", "content": results})


async def _run_anthropic_uses(code_mode: CodeMode, blocks: list[Any]) -> list[dict[str, Any]]:
    results = []
    for block in blocks:
        if block.type != "tool_use":
            continue
        print(f"model -> {block.name} ({block.id})")
        output = await code_mode.call(block.name, block.id, block.input)
        show(block.name, output)
        results.append(output.to_anthropic(block.id))
    return results


def _start_answer() -> None:
    print("model: ", end="", flush=True)


async def run(api: str, base_url: str | None, model: str, stream: bool, question: str) -> str:
    """One conversation: the question, the loop, the answer (printed as it goes)."""
    async with codemode.open_process_provider() as provider:
        session = await provider.create_session()
        code_mode = CodeMode(session, toolbox, toolbox.definitions())
        print(f"user: {question}")
        conversation: list[Any] = [{"role": "user", "content": question}]
        if api == "openai":
            async with AsyncOpenAI(base_url=base_url) as openai_client:
                return await openai_loop(
                    code_mode, openai_client, model, conversation, stream=stream
                )
        async with AsyncAnthropic(base_url=base_url) as anthropic_client:
            return await anthropic_loop(
                code_mode, anthropic_client, model, conversation, stream=stream
            )


async def main(arguments: argparse.Namespace) -> None:
    if not arguments.scripted:
        await run(
            arguments.api, arguments.base_url, arguments.model, arguments.stream, arguments.question
        )
        return
    async with trio.open_nursery() as nursery:
        port = await nursery.start(scripted_model.serve)
        base_url = f"http://127.0.0.1:{port}" + ("/v1" if arguments.api == "openai" else "")
        key = "OPENAI_API_KEY" if arguments.api == "openai" else "ANTHROPIC_API_KEY"
        os.environ.setdefault(key, "scripted")  # the scripted model takes any key
        await run(
            arguments.api, base_url, scripted_model.MODEL, arguments.stream, arguments.question
        )
        nursery.cancel_scope.cancel()


def parse_arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--api", choices=["openai", "anthropic"], default="openai")
    parser.add_argument("--base-url", help="the API's address (default: the SDK's own)")
    parser.add_argument("--model", default=scripted_model.MODEL)
    parser.add_argument("--stream", action="store_true", help="stream the model's responses")
    parser.add_argument("--question", default=QUESTION)
    parser.add_argument(
        "--scripted",
        action="store_true",
        help="talk to the scripted model of examples/scripted_model.py, on a local port",
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    trio.run(main, parse_arguments(sys.argv[1:]))
