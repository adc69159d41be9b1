"""The `openai` and `anthropic` SDKs' async clients, end to end: run on trio, against the
scripted model of `examples/scripted_model.py` on a local port (the Responses API's and the
Messages API's wire formats, JSON and server-sent events), through the loops of
`examples/agent_loop.py`. Offline: no network, no key.
"""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
from anthropic import AsyncAnthropic
from anthropic.types import Message, RawMessageStreamEvent, ToolResultBlockParam
from openai import AsyncOpenAI
from openai.types.responses import Response, ResponseInputItemParam, ResponseStreamEvent
from pydantic import TypeAdapter

import codemode
from codemode.model import CodeMode, tool_specs
from examples import agent_loop, scripted_model
from examples.weather_tools import toolbox as weather
from tests.test_model_specs import check_typed_dict

APIS = ["openai", "anthropic"]
MODES = [pytest.param(False, id="json"), pytest.param(True, id="stream")]


@asynccontextmanager
async def scripted(api: str) -> AsyncIterator[tuple[AsyncOpenAI | AsyncAnthropic, list[Any]]]:
    """A client of `api` talking to the scripted model, and the request bodies it sent."""
    record: list[Any] = []
    async with trio.open_nursery() as nursery:
        port = await nursery.start(
            lambda task_status: scripted_model.serve(0, record=record, task_status=task_status)
        )
        address = f"http://127.0.0.1:{port}"
        client: AsyncOpenAI | AsyncAnthropic
        if api == "openai":
            client = AsyncOpenAI(base_url=f"{address}/v1", api_key="test", max_retries=0)
        else:
            client = AsyncAnthropic(base_url=address, api_key="test", max_retries=0)
        async with client:
            yield client, record
        nursery.cancel_scope.cancel()


async def converse(
    api: str, code_mode: CodeMode, question: str, *, stream: bool
) -> tuple[str, list[Any]]:
    async with scripted(api) as (client, record):
        conversation: list[Any] = [{"role": "user", "content": question}]
        with trio.fail_after(30):
            if isinstance(client, AsyncOpenAI):
                answer = await agent_loop.openai_loop(
                    code_mode, client, scripted_model.MODEL, conversation, stream=stream
                )
            else:
                answer = await agent_loop.anthropic_loop(
                    code_mode, client, scripted_model.MODEL, conversation, stream=stream
                )
    return answer, record


def tool_results(api: str, request: Any) -> list[dict[str, Any]]:
    """The tool results a request body carries, checked against the SDK's own types."""
    if api == "openai":
        found = [i for i in request["input"] if i.get("type", "").endswith("call_output")]
        for item in found:
            check_typed_dict(ResponseInputItemParam, item)
    else:
        found = [
            block
            for message in request["messages"]
            if isinstance(message["content"], list)
            for block in message["content"]
            if block.get("type") == "tool_result"
        ]
        for block in found:
            check_typed_dict(ToolResultBlockParam, block)
    return found


class Recorded:
    """The weather tools, recording each call; `forecast` can be held until cancelled."""

    def __init__(self, *, hold_cities: bool = False) -> None:
        self.calls: list[str] = []
        self.cancelled: list[str] = []
        self.entered = trio.Event()
        self.hold_cities = hold_cities
        self.toolbox = codemode.Toolbox()

        @self.toolbox.tool
        async def list_cities() -> list[str]:
            """The cities these tools know."""
            self.calls.append("list_cities")
            self.entered.set()
            if self.hold_cities:
                try:
                    await trio.sleep_forever()
                except trio.Cancelled:
                    self.cancelled.append("list_cities")
                    raise
            return ["Lima", "Oslo"]

        @self.toolbox.tool
        async def current_temperature(city: str) -> dict[str, Any]:
            """The temperature in a city right now."""
            self.calls.append(f"current_temperature {city}")
            if city not in {"Lima", "Oslo"}:
                raise codemode.ToolError(f"unknown city: {city}")
            return {"city": city, "degrees": 19.0 if city == "Lima" else -2.0}

        @self.toolbox.tool
        async def forecast(city: str, days: int = 3) -> list[dict[str, Any]]:
            """The forecast of a city for the next days."""
            self.calls.append(f"forecast {city}")
            return [
                {"day": day, "low": 15 + day, "high": 22 + day, "sky": "sunny"}
                for day in range(1, days + 1)
            ]


@pytest.mark.parametrize("stream", MODES)
@pytest.mark.parametrize("api", APIS)
async def test_a_turn_calls_two_tools_around_a_yield_and_the_model_reads_the_results(
    api: str, stream: bool
) -> None:
    tools = Recorded()
    async with codemode.open_in_process_provider() as provider:
        session = await provider.create_session()
        code_mode = CodeMode(session, tools.toolbox, tools.toolbox.definitions())
        answer, requests = await converse(api, code_mode, agent_loop.QUESTION, stream=stream)
    # The cell called the application's tools, `forecast` after its `yield_control()` (the
    # temperatures concurrently, in any order).
    assert tools.calls[0] == "list_cities"
    assert sorted(tools.calls[1:3]) == ["current_temperature Lima", "current_temperature Oslo"]
    assert tools.calls[3:] == ["forecast Lima"]
    # Three requests: the question; the exec result (running, cell 1); the wait result.
    assert [len(tool_results(api, request)) for request in requests] == [0, 1, 2]
    assert answer == (
        "Here is what I found:\n"
        "warmest: Lima at 19 C\n"
        "day 1: sunny, 16 to 23 C\n"
        "day 2: sunny, 17 to 24 C\n"
        "day 3: sunny, 18 to 25 C"
    )


@pytest.mark.parametrize("stream", MODES)
@pytest.mark.parametrize("api", APIS)
async def test_a_tool_that_raises_fails_the_cell_and_the_model_reads_why(
    api: str, stream: bool
) -> None:
    tools = Recorded()
    async with codemode.open_in_process_provider() as provider:
        session = await provider.create_session()
        code_mode = CodeMode(session, tools.toolbox, tools.toolbox.definitions())
        answer, requests = await converse(api, code_mode, "How warm is Atlantis?", stream=stream)
    assert tools.calls == ["current_temperature Atlantis"]
    [result] = tool_results(api, requests[-1])
    if api == "anthropic":
        assert result["is_error"] is True
    assert answer == "The tools could not answer: unknown city: Atlantis"


@pytest.mark.parametrize("stream", MODES)
@pytest.mark.parametrize("api", APIS)
async def test_cancelling_the_loop_terminates_the_cell_it_started(api: str, stream: bool) -> None:
    tools = Recorded(hold_cities=True)
    async with codemode.open_in_process_provider() as provider:
        session = await provider.create_session()
        code_mode = CodeMode(session, tools.toolbox, tools.toolbox.definitions())
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(
                    functools.partial(converse, api, code_mode, agent_loop.QUESTION, stream=stream)
                )
                await tools.entered.wait()
                nursery.cancel_scope.cancel()
            # The exec call was cancelled: its cell is terminated and its tool call cancelled
            # before the cancellation left the loop.
            assert tools.cancelled == ["list_cities"]
            assert await session.cells() == []


def test_the_scripted_model_speaks_the_sdks_wire_formats() -> None:
    # Every body and event the server sends, checked against the SDKs' own models, with no
    # unknown field: what the clients parse is what the APIs send.
    question = [{"role": "user", "content": "Which city?"}]
    model = scripted_model.MODEL
    openai_body = {"model": model, "tools": tool_specs("openai", []), "input": question}
    anthropic_body = {"model": model, "tools": tool_specs("anthropic", []), "messages": question}
    formats: list[tuple[str, dict[str, Any], Any, Any]] = [
        ("/v1/responses", openai_body, Response, ResponseStreamEvent),
        ("/v1/messages", anthropic_body, Message, RawMessageStreamEvent),
    ]
    for path, body, whole, event_type in formats:
        status, content_type, chunks = scripted_model.answer(path, body)
        assert (status, content_type) == (200, "application/json")
        whole_adapter: TypeAdapter[Any] = TypeAdapter(whole)
        whole_adapter.validate_json(b"".join(chunks), extra="forbid")
        status, content_type, chunks = scripted_model.answer(path, {**body, "stream": True})
        assert (status, content_type) == (200, "text/event-stream")
        events: TypeAdapter[Any] = TypeAdapter(event_type)
        for chunk in chunks:
            name, data = chunk.decode().removesuffix("\n\n").split("\n")
            event = json.loads(data.removeprefix("data: "))
            assert name == f"event: {event['type']}"
            events.validate_python(event, extra="forbid")


async def test_the_weather_example_tools_answer_the_scripted_model() -> None:
    # The example's own tools, as `examples.agent_loop --scripted` uses them.
    async with codemode.open_in_process_provider() as provider:
        session = await provider.create_session()
        code_mode = CodeMode(session, weather, weather.definitions())
        answer, _ = await converse("openai", code_mode, agent_loop.QUESTION, stream=False)
    assert answer.startswith("Here is what I found:\nwarmest: Lima at 19 C\nday 1: cloudy")
