"""Drive real engine cells to the end, the way the runtime will: answer tool calls, fire timers.

`run_cell` starts a cell, collects every event it publishes until `Finished`, answers each tool
call with `on_tool` (default: `{"value": "output"}`, as the seed's recording delegate does) and
fires each timer after its delay on trio's clock.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import msgspec
import trio
from codemode_host.engine import (
    CellEvent,
    CellTool,
    Engine,
    EngineCell,
    Finished,
    ImageOutput,
    Notification,
    StoredValueWritten,
    TextOutput,
    TimerStarted,
    ToolCallRequested,
)

DEFAULT_TOOL_RESULT = b'{"value":"output"}'


class ToolRejectedError(Exception):
    """Raised by an `on_tool` handler to reject the JS promise with `text`."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


ToolHandler = Callable[[ToolCallRequested], Awaitable[object]]


@dataclass
class CellRun:
    """Everything one cell published, in order."""

    events: list[CellEvent] = field(default_factory=list)

    @property
    def finished(self) -> Finished:
        last = self.events[-1]
        assert isinstance(last, Finished), self.events
        return last

    @property
    def error(self) -> str | None:
        return self.finished.error_text

    @property
    def texts(self) -> list[str]:
        return [e.text for e in self.events if isinstance(e, TextOutput)]

    @property
    def images(self) -> list[ImageOutput]:
        return [e for e in self.events if isinstance(e, ImageOutput)]

    @property
    def notifications(self) -> list[str]:
        return [e.text for e in self.events if isinstance(e, Notification)]

    @property
    def tool_calls(self) -> list[ToolCallRequested]:
        return [e for e in self.events if isinstance(e, ToolCallRequested)]

    @property
    def stores(self) -> list[StoredValueWritten]:
        return [e for e in self.events if isinstance(e, StoredValueWritten)]


async def default_tool(call: ToolCallRequested) -> object:
    return msgspec.Raw(DEFAULT_TOOL_RESULT)


async def _answer(cell: EngineCell, call: ToolCallRequested, on_tool: ToolHandler) -> None:
    try:
        result = await on_tool(call)
    except ToolRejectedError as rejection:
        cell.reject_tool_call(call.call_id, rejection.text)
    else:
        cell.settle_tool_call(call.call_id, msgspec.json.encode(result))


async def _fire(cell: EngineCell, timer: TimerStarted) -> None:
    await trio.sleep(min(timer.delay_ms, 86_400_000) / 1000)
    cell.fire_timer(timer.timer_id)


async def drive(cell: EngineCell, *, on_tool: ToolHandler = default_tool) -> CellRun:
    """Collect the cell's events until it finishes, answering tool calls and timers."""
    run = CellRun()
    async with trio.open_nursery() as nursery:
        while True:
            for event in await cell.next_events():
                run.events.append(event)
                if isinstance(event, ToolCallRequested):
                    nursery.start_soon(_answer, cell, event, on_tool)
                elif isinstance(event, TimerStarted):
                    nursery.start_soon(_fire, cell, event)
                elif isinstance(event, Finished):
                    nursery.cancel_scope.cancel()
                    return run
    raise AssertionError("unreachable")  # pragma: no cover


async def run_cell(
    engine: Engine,
    source: str,
    *,
    tools: Sequence[CellTool] = (),
    on_tool: ToolHandler = default_tool,
    stored_values: dict[str, bytes] | None = None,
    heap_limit: int | None = None,
    stack_limit: int | None = None,
    cpu_limit_ms: int | None = None,
) -> CellRun:
    """Run `source` in a fresh cell to its end (bounded by 10 s on trio's clock)."""
    with trio.fail_after(10):
        with engine.start_cell(
            source,
            tools=tools,
            stored_values=stored_values,
            heap_limit=heap_limit,
            stack_limit=stack_limit,
            cpu_limit_ms=cpu_limit_ms,
        ) as cell:
            return await drive(cell, on_tool=on_tool)


async def wait_for(cell: EngineCell, predicate: Callable[[CellEvent], bool]) -> list[CellEvent]:
    """Collect events until one satisfies `predicate`; return all collected so far."""
    seen: list[CellEvent] = []
    while True:
        batch = await cell.next_events()
        seen.extend(batch)
        if any(predicate(event) for event in batch):
            return seen


async def wait_exited(pid: int) -> None:
    """Until process `pid` has exited (its pidfd turns readable; at once if it is gone)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        await trio.lowlevel.wait_readable(fd)
    finally:
        os.close(fd)


def ended(run: CellRun) -> Finished:
    """How the cell's JavaScript ended, without its heap and CPU figures (which vary)."""
    return msgspec.structs.replace(run.finished, heap_bytes=0, cpu_us=0)


def without_heap(event: CellEvent) -> CellEvent:
    """`event`, with a `Finished`'s heap and CPU figures zeroed, for comparing it whole."""
    if isinstance(event, Finished):
        return msgspec.structs.replace(event, heap_bytes=0, cpu_us=0)
    return event
