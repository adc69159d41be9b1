"""`codemode.integrations.pydantic_ai`: a pydantic-ai `Agent` in code mode, with pydantic-ai's
own offline model (`FunctionModel`), under asyncio through `codemode.aio` (pydantic-ai 2.68
starts asyncio tasks itself, so it does not run under `trio.run`).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic_ai import Agent, AgentRunResultEvent, ModelRetry
from pydantic_ai.messages import (
    FunctionToolCallEvent,
    FunctionToolResultEvent,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    PartDeltaEvent,
    TextPart,
    TextPartDelta,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel
from pydantic_ai.toolsets import FunctionToolset

import codemode.aio
from codemode.integrations.pydantic_ai import CodeModeToolset
from tests.asyncio_agents import TWO_TOOLS, check_streamed_run, run_on_asyncio


def returns(messages: list[ModelMessage]) -> list[str]:
    """The tool results the model was sent so far, in order."""
    return [
        str(part.content)
        for message in messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart)
    ]


def scripted(code: str, *, log: list[str] | None = None) -> FunctionModel:
    """A model that runs `code`, waits while it reports a running cell, then answers with what
    the cells printed. Streamed (`stream_function`), each tool call comes in three chunks (its
    name and id, then each half of its JSON arguments) and the answer line by line, and
    `response streamed` goes to `log` after each response's last chunk (the tests pass the
    tools' log of their calls, to see what ran when)."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        assert [tool.name for tool in info.function_tools] == ["exec", "wait"]
        seen = returns(messages)
        if not seen:
            return ModelResponse(parts=[ToolCallPart("exec", {"code": code}, "call-1")])
        running = re.match(r"Script running with cell ID (\S+)", seen[-1])
        if running:
            arguments = {"cell_id": running.group(1), "yield_time_ms": 5000}
            return ModelResponse(parts=[ToolCallPart("wait", arguments, f"call-{len(seen) + 1}")])
        findings = [line for text in seen for line in text.splitlines()[3:] if line]
        return ModelResponse(parts=[TextPart("\n".join(findings))])

    async def stream(
        messages: list[ModelMessage], info: AgentInfo
    ) -> AsyncIterator[str | DeltaToolCalls]:
        for part in respond(messages, info).parts:
            if isinstance(part, TextPart):
                for line in part.content.splitlines(keepends=True):
                    yield line
                continue
            assert isinstance(part, ToolCallPart)
            arguments = part.args_as_json_str()
            half = len(arguments) // 2
            yield {0: DeltaToolCall(name=part.tool_name, tool_call_id=part.tool_call_id)}
            yield {0: DeltaToolCall(json_args=arguments[:half])}
            yield {0: DeltaToolCall(json_args=arguments[half:])}
        if log is not None:
            log.append("response streamed")

    return FunctionModel(respond, stream_function=stream)


class Tools:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.entered = asyncio.Event()
        self.cancelled: list[str] = []
        self.toolset: FunctionToolset[None] = FunctionToolset()

        @self.toolset.tool_plain
        async def lookup(city: str) -> float:
            """The temperature of a city in degrees Celsius."""
            self.calls.append(f"lookup {city}")
            await asyncio.sleep(0)
            if city == "Atlantis":
                raise ModelRetry("no such city: Atlantis")
            return 19.0

        @self.toolset.tool_plain
        def convert(celsius: float) -> float:
            """Celsius to Fahrenheit."""
            self.calls.append(f"convert {celsius}")
            return celsius * 9 / 5 + 32

        @self.toolset.tool_plain
        async def hold() -> str:
            """Never returns."""
            self.entered.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled.append("hold")
                raise
            return "unreachable"


def test_an_agent_turn_calls_two_tools_around_a_yield_and_reads_the_results() -> None:
    tools = Tools()

    async def main() -> None:
        async with codemode.aio.open_in_process_provider() as provider:
            session = await provider.create_session()
            toolset = CodeModeToolset(session, tools.toolset)
            agent = Agent(scripted(TWO_TOOLS), toolsets=[toolset])
            result = await agent.run("How warm is Lima?")
            assert result.output == "celsius 19\nfahrenheit 66.2"
            # The model saw the nested tools only inside exec's description.
            tool_defs = await toolset.get_tools(_context(agent))
            assert list(tool_defs) == ["exec", "wait"]
            assert "lookup(args: { city: string; })" in (
                tool_defs["exec"].tool_def.description or ""
            )

    run_on_asyncio(main)
    assert tools.calls == ["lookup Lima", "convert 19.0"]


def _context(agent: Agent[None, str]) -> Any:
    from pydantic_ai import RunContext
    from pydantic_ai.usage import RunUsage

    return RunContext(deps=None, model=agent.model, usage=RunUsage())  # type: ignore[arg-type]


def test_a_tool_that_raises_rejects_the_cells_promise() -> None:
    tools = Tools()
    code = """\
try { await tools.lookup({ city: "Atlantis" }); } catch (error) { text(`caught: ${error}`); }
await tools.lookup({ city: 3 });
"""

    async def main() -> None:
        async with codemode.aio.open_in_process_provider() as provider:
            session = await provider.create_session()
            agent = Agent(scripted(code), toolsets=[CodeModeToolset(session, tools.toolset)])
            result = await agent.run("How warm is Atlantis?")
            lines = result.output.splitlines()
            assert lines[0] == "caught: no such city: Atlantis"
            assert lines[1] == "Script error:"
            assert lines[2].startswith("tool lookup failed: 1 validation error")

    run_on_asyncio(main)
    assert tools.calls == ["lookup Atlantis"]


def test_cancelling_the_agent_run_terminates_the_cell_and_cancels_its_tool() -> None:
    tools = Tools()

    async def main() -> None:
        async with codemode.aio.open_in_process_provider() as provider:
            session = await provider.create_session()
            agent = Agent(
                scripted("await tools.hold()"), toolsets=[CodeModeToolset(session, tools.toolset)]
            )
            run = asyncio.create_task(agent.run("Hold on"))
            await tools.entered.wait()
            run.cancel()
            with pytest.raises(asyncio.CancelledError):
                await run
            assert tools.cancelled == ["hold"]
            assert await session.cells() == []

    run_on_asyncio(main)


def test_a_streamed_run_calls_the_tools_once_each_call_is_complete() -> None:
    tools = Tools()

    async def main() -> None:
        async with codemode.aio.open_in_process_provider() as provider:
            session = await provider.create_session()
            model = scripted(TWO_TOOLS, log=tools.calls)
            agent = Agent(model, toolsets=[CodeModeToolset(session, tools.toolset)])
            async with agent.run_stream("How warm is Lima?") as response:
                deltas = [
                    delta async for delta in response.stream_text(delta=True, debounce_by=None)
                ]
            assert deltas == ["celsius 19\n", "fahrenheit 66.2"]
            headers = [text.splitlines()[0] for text in returns(response.all_messages())]
            assert headers == ["Script running with cell ID 1", "Script completed"]

    run_on_asyncio(main)
    check_streamed_run(tools.calls)


def test_a_run_streaming_its_events_shows_each_exec_and_wait_and_their_results() -> None:
    tools = Tools()

    async def main() -> None:
        async with codemode.aio.open_in_process_provider() as provider:
            session = await provider.create_session()
            model = scripted(TWO_TOOLS, log=tools.calls)
            agent = Agent(model, toolsets=[CodeModeToolset(session, tools.toolset)])
            steps: list[str] = []
            text: list[str] = []
            async with agent.run_stream_events("How warm is Lima?") as events:
                async for event in events:
                    if isinstance(event, FunctionToolCallEvent):
                        steps.append(f"call {event.part.tool_name} {event.part.args_as_dict()}")
                    elif isinstance(event, FunctionToolResultEvent):
                        lines = str(event.part.content).splitlines()
                        steps.append(f"result {lines[0]}: {lines[-1]}")
                    elif isinstance(event, PartDeltaEvent) and isinstance(
                        event.delta, TextPartDelta
                    ):
                        text.append(event.delta.content_delta)
                    elif isinstance(event, AgentRunResultEvent):
                        steps.append(f"output {event.result.output!r}")
            assert steps == [
                f"call exec {{'code': {TWO_TOOLS!r}}}",
                "result Script running with cell ID 1: celsius 19",
                "call wait {'cell_id': '1', 'yield_time_ms': 5000}",
                "result Script completed: fahrenheit 66.2",
                "output 'celsius 19\\nfahrenheit 66.2'",
            ]
            # The answer's first line starts its text part; the deltas are the rest.
            assert text == ["fahrenheit 66.2"]

    run_on_asyncio(main)
    check_streamed_run(tools.calls)
