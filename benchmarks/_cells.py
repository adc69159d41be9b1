"""The cells' side of the benchmarks: the two providers, a delegate with the tools the
workloads call, and running a cell to its initial response through the public API.

Tools (`TOOLS`): `echo` answers `{}`; `sleep` answers after 10 ms; `big` returns one 16 MiB
string; `objects` returns 100,000 small objects; `never` never answers (until cancelled).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

import trio

import codemode
from benchmarks._measure import WorkloadError
from codemode import (
    Completed,
    ExecuteRequest,
    JsonValue,
    NestedToolCall,
    RuntimeResponse,
    Session,
    ToolDefinition,
    ToolName,
)

BIG_BYTES = 16 << 20
OBJECTS = 100_000
SLEEP_S = 0.010

Opener = Callable[[], AbstractAsyncContextManager[Any]]

PROVIDERS: dict[str, Opener] = {
    "in-process": codemode.open_in_process_provider,
    "process": codemode.open_process_provider,
}


def tool(name: str) -> ToolDefinition:
    return ToolDefinition(name=name, tool_name=ToolName.plain(name))


TOOLS = {name: tool(name) for name in ("echo", "sleep", "big", "objects", "never")}


class Delegate:
    """Answers the benchmark tools; records when each call arrived and each notification."""

    def __init__(self) -> None:
        self.arrivals: list[float] = []
        self.record_arrivals = False
        self.notified = trio.Event()
        self.closed = 0
        self._big: str | None = None
        self._objects: list[dict[str, Any]] | None = None

    async def invoke_tool(self, call: NestedToolCall) -> JsonValue:
        if self.record_arrivals:
            self.arrivals.append(time.perf_counter())
        name = call.tool_name.name
        if name == "echo":
            return {}
        if name == "sleep":
            await trio.sleep(SLEEP_S)
            return None
        if name == "big":
            return self.big()
        if name == "objects":
            return self.objects()
        if name == "never":
            await trio.sleep_forever()
        raise codemode.ToolError(f"no tool {name}")

    def big(self) -> str:
        """The 16 MiB string, made once (not on the clock of the calls that return it)."""
        if self._big is None:
            self._big = "x" * BIG_BYTES
        return self._big

    def objects(self) -> list[dict[str, Any]]:
        """The 100,000 small objects, made once."""
        if self._objects is None:
            self._objects = [{"i": i, "s": "ab"} for i in range(OBJECTS)]
        return self._objects

    async def notify(self, call_id: str, cell_id: str, text: str) -> None:
        self.notified.set()

    def cell_closed(self, cell_id: str) -> None:
        self.closed += 1


def request(source: str, tools: Sequence[str] = ()) -> ExecuteRequest:
    return ExecuteRequest(
        tool_call_id="bench", source=source, enabled_tools=[TOOLS[name] for name in tools]
    )


async def run_cell(
    session: Session, source: str, delegate: Delegate, tools: Sequence[str] = ()
) -> RuntimeResponse:
    """Execute `source` and await its initial response, which must be a success."""
    started = await session.execute(request(source, tools), delegate)
    response = await started.initial_response()
    if not isinstance(response, Completed) or response.error_text is not None:
        raise WorkloadError(f"the benchmark cell did not complete: {response}")
    return response


async def timed_cell(
    session: Session, source: str, delegate: Delegate, tools: Sequence[str] = ()
) -> float:
    """Seconds from `execute` to the initial response (`Completed`)."""
    start = time.perf_counter()
    await run_cell(session, source, delegate, tools)
    return time.perf_counter() - start
