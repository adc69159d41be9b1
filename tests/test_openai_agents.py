"""`codemode.integrations.openai_agents`: an OpenAI Agents SDK agent in code mode, with a
scripted model behind the SDK's own model interface (`agents.models.interface.Model`), under
asyncio through `codemode.aio` (the SDK runs on asyncio). Offline: no network, no key.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from collections.abc import AsyncIterator
from typing import Any, Literal

import pytest
from agents import (
    Agent,
    FunctionTool,
    ModelResponse,
    RawResponsesStreamEvent,
    RunConfig,
    RunItemStreamEvent,
    Runner,
    ToolCallItem,
    ToolCallOutputItem,
    Usage,
    function_tool,
)
from agents.models.interface import Model
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseContentPartAddedEvent,
    ResponseContentPartDoneEvent,
    ResponseCreatedEvent,
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseFunctionCallArgumentsDoneEvent,
    ResponseFunctionToolCall,
    ResponseOutputItemAddedEvent,
    ResponseOutputItemDoneEvent,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseTextDeltaEvent,
    ResponseTextDoneEvent,
)

import codemode.aio
from codemode.integrations.openai_agents import code_mode_tools
from tests.asyncio_agents import TWO_TOOLS, check_streamed_run, run_on_asyncio

OFFLINE = RunConfig(tracing_disabled=True)  # the SDK's tracing would export to OpenAI


class ScriptedModel(Model):
    """Runs `code` with `exec`, calls `wait` while the cell runs, then answers with what the
    cells printed: it reads the tool results it is sent, as a model would.

    Streamed (`stream_response`), it sends the Responses API's events for the same output item:
    a tool call's arguments in two deltas, the answer line by line, then `response.completed`;
    and `response streamed` goes to `log` after each response's last event (the tests pass the
    tools' log of their calls, to see what ran when)."""

    def __init__(self, code: str, log: list[str] | None = None) -> None:
        self.code = code
        self.log = log

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        return self._respond(*args, **kwargs)

    def _respond(self, *args: Any, **kwargs: Any) -> ModelResponse:
        items: list[Any] = kwargs.get("input", args[1] if len(args) > 1 else [])
        tools = kwargs.get("tools", args[3] if len(args) > 3 else [])
        assert [tool.name for tool in tools] == ["exec", "wait"]
        seen = [
            item["output"]
            for item in items
            if isinstance(item, dict) and item.get("type") == "function_call_output"
        ]
        n = len(seen) + 1
        if not seen:
            return self._call(n, "exec", {"code": self.code})
        running = re.match(r"Script running with cell ID (\S+)", seen[-1])
        if running:
            return self._call(n, "wait", {"cell_id": running.group(1), "yield_time_ms": 5000})
        findings = [line for text in seen for line in text.splitlines()[3:] if line]
        text = ResponseOutputText(type="output_text", text="\n".join(findings), annotations=[])
        message = ResponseOutputMessage(
            id=f"msg_{n}", type="message", role="assistant", status="completed", content=[text]
        )
        return ModelResponse(output=[message], usage=Usage(), response_id=None)

    @staticmethod
    def _call(n: int, name: str, arguments: dict[str, Any]) -> ModelResponse:
        call = ResponseFunctionToolCall(
            type="function_call",
            id=f"fc_{n}",
            call_id=f"call_{n}",
            name=name,
            arguments=json.dumps(arguments),
            status="completed",
        )
        return ModelResponse(output=[call], usage=Usage(), response_id=None)

    async def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        (item,) = self._respond(*args, **kwargs).output
        numbers = itertools.count()
        assert item.id is not None
        item_id = item.id
        yield ResponseCreatedEvent(
            type="response.created",
            response=_response([], "in_progress"),
            sequence_number=next(numbers),
        )
        if isinstance(item, ResponseFunctionToolCall):
            started = item.model_copy(update={"arguments": "", "status": "in_progress"})
            yield ResponseOutputItemAddedEvent(
                type="response.output_item.added",
                item=started,
                output_index=0,
                sequence_number=next(numbers),
            )
            half = len(item.arguments) // 2
            for delta in (item.arguments[:half], item.arguments[half:]):
                yield ResponseFunctionCallArgumentsDeltaEvent(
                    type="response.function_call_arguments.delta",
                    delta=delta,
                    sequence_number=next(numbers),
                    item_id=item_id,
                    output_index=0,
                )
            yield ResponseFunctionCallArgumentsDoneEvent(
                type="response.function_call_arguments.done",
                arguments=item.arguments,
                sequence_number=next(numbers),
                item_id=item_id,
                output_index=0,
            )
        else:
            assert isinstance(item, ResponseOutputMessage)
            (part,) = item.content
            assert isinstance(part, ResponseOutputText)
            opened = item.model_copy(update={"content": [], "status": "in_progress"})
            yield ResponseOutputItemAddedEvent(
                type="response.output_item.added",
                item=opened,
                output_index=0,
                sequence_number=next(numbers),
            )
            empty = ResponseOutputText(type="output_text", text="", annotations=[])
            yield ResponseContentPartAddedEvent(
                type="response.content_part.added",
                content_index=0,
                part=empty,
                sequence_number=next(numbers),
                item_id=item_id,
                output_index=0,
            )
            for line in part.text.splitlines(keepends=True):
                yield ResponseTextDeltaEvent(
                    type="response.output_text.delta",
                    content_index=0,
                    delta=line,
                    logprobs=[],
                    sequence_number=next(numbers),
                    item_id=item_id,
                    output_index=0,
                )
            yield ResponseTextDoneEvent(
                type="response.output_text.done",
                content_index=0,
                text=part.text,
                logprobs=[],
                sequence_number=next(numbers),
                item_id=item_id,
                output_index=0,
            )
            yield ResponseContentPartDoneEvent(
                type="response.content_part.done",
                content_index=0,
                part=part,
                sequence_number=next(numbers),
                item_id=item_id,
                output_index=0,
            )
        yield ResponseOutputItemDoneEvent(
            type="response.output_item.done",
            item=item,
            output_index=0,
            sequence_number=next(numbers),
        )
        yield ResponseCompletedEvent(
            type="response.completed",
            response=_response([item], "completed"),
            sequence_number=next(numbers),
        )
        if self.log is not None:
            self.log.append("response streamed")


def _response(output: list[Any], status: Literal["in_progress", "completed"]) -> Response:
    return Response(
        id="resp_1",
        created_at=0,
        model="scripted",
        object="response",
        output=output,
        tool_choice="auto",
        tools=[],
        top_p=None,
        parallel_tool_calls=False,
        status=status,
    )


class Tools:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.entered = asyncio.Event()
        self.cancelled: list[str] = []

        @function_tool
        async def lookup(city: str) -> float:
            """The temperature of a city in degrees Celsius."""
            self.calls.append(f"lookup {city}")
            await asyncio.sleep(0)
            return 19.0

        @function_tool
        def convert(celsius: float) -> float:
            """Celsius to Fahrenheit."""
            self.calls.append(f"convert {celsius}")
            return celsius * 9 / 5 + 32

        @function_tool(failure_error_function=None)
        async def broken(city: str) -> float:
            """Always fails."""
            self.calls.append(f"broken {city}")
            raise ValueError(f"the service is down for {city}")

        @function_tool
        async def hold() -> str:
            """Never returns."""
            self.entered.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled.append("hold")
                raise
            return "unreachable"

        self.tools: list[FunctionTool] = [lookup, convert, broken, hold]


def test_an_agent_turn_calls_two_tools_around_a_yield_and_reads_the_results() -> None:
    tools = Tools()

    async def main() -> None:
        async with codemode.aio.open_in_process_provider() as provider:
            session = await provider.create_session()
            code_mode = code_mode_tools(session, tools.tools)
            exec_tool = code_mode[0]
            assert isinstance(exec_tool, FunctionTool)
            assert exec_tool.name == "exec"
            assert "lookup(args: { city: string; })" in exec_tool.description
            agent = Agent(name="weather", model=ScriptedModel(TWO_TOOLS), tools=code_mode)
            result = await Runner.run(agent, "How warm is Lima?", run_config=OFFLINE)
            assert result.final_output == "celsius 19\nfahrenheit 66.2"

    run_on_asyncio(main)
    assert tools.calls == ["lookup Lima", "convert 19.0"]


def test_a_tool_that_raises_rejects_the_cells_promise() -> None:
    tools = Tools()
    code = (
        'try { await tools.broken({ city: "Lima" }); } catch (error) { text(`caught: ${error}`); }'
    )

    async def main() -> None:
        async with codemode.aio.open_in_process_provider() as provider:
            session = await provider.create_session()
            agent = Agent(
                name="weather",
                model=ScriptedModel(code),
                tools=code_mode_tools(session, tools.tools),
            )
            result = await Runner.run(agent, "How warm is Lima?", run_config=OFFLINE)
            assert result.final_output.startswith("caught: tool broken failed: ")
            assert "the service is down for Lima" in result.final_output

    run_on_asyncio(main)
    assert tools.calls == ["broken Lima"]


def test_cancelling_the_run_terminates_the_cell_and_cancels_its_tool() -> None:
    tools = Tools()

    async def main() -> None:
        async with codemode.aio.open_in_process_provider() as provider:
            session = await provider.create_session()
            agent = Agent(
                name="weather",
                model=ScriptedModel("await tools.hold()"),
                tools=code_mode_tools(session, tools.tools),
            )
            run = asyncio.create_task(Runner.run(agent, "Hold on", run_config=OFFLINE))
            await tools.entered.wait()
            run.cancel()
            with pytest.raises(asyncio.CancelledError):
                await run
            # The SDK cancels its tool task and does not wait for it: the cell's termination
            # has begun, and ends on its own (shutdown waits for that end).
            assert {cell.phase for cell in await session.cells()} <= {"terminating"}
            await session.shutdown()
            assert tools.cancelled == ["hold"]

    run_on_asyncio(main)


def test_a_streamed_run_calls_the_tools_once_each_call_is_complete() -> None:
    tools = Tools()

    async def main() -> None:
        async with codemode.aio.open_in_process_provider() as provider:
            session = await provider.create_session()
            agent = Agent(
                name="weather",
                model=ScriptedModel(TWO_TOOLS, log=tools.calls),
                tools=code_mode_tools(session, tools.tools),
            )
            result = Runner.run_streamed(agent, "How warm is Lima?", run_config=OFFLINE)
            steps: list[str] = []
            deltas: list[str] = []
            async for event in result.stream_events():
                if isinstance(event, RawResponsesStreamEvent):
                    if isinstance(event.data, ResponseTextDeltaEvent):
                        deltas.append(event.data.delta)
                elif isinstance(event, RunItemStreamEvent):
                    if isinstance(event.item, ToolCallItem):
                        raw = event.item.raw_item
                        assert isinstance(raw, ResponseFunctionToolCall)
                        steps.append(f"call {raw.name} {json.loads(raw.arguments)}")
                    elif isinstance(event.item, ToolCallOutputItem):
                        lines = str(event.item.output).splitlines()
                        steps.append(f"result {lines[0]}: {lines[-1]}")
            assert steps == [
                f"call exec {{'code': {TWO_TOOLS!r}}}",
                "result Script running with cell ID 1: celsius 19",
                "call wait {'cell_id': '1', 'yield_time_ms': 5000}",
                "result Script completed: fahrenheit 66.2",
            ]
            assert deltas == ["celsius 19\n", "fahrenheit 66.2"]
            assert result.final_output == "celsius 19\nfahrenheit 66.2"

    run_on_asyncio(main)
    check_streamed_run(tools.calls)
