"""The bare engine (`codemode_host.engine`) as a floor: what running a cell costs without a
runtime, a session or a wire around it.

- `round_trip`: `start_cell` -> `Finished` of a trivial cell;
- `tool_turns`: one tool-call turn of a warm cell (settle -> the next `ToolCallRequested`);
- `interrupt`: `interrupt()` of a spinning cell -> `Finished(INTERRUPTED)` in trio;
- `timed_source`: a whole cell, start -> `Finished`, failing loudly if the cell failed.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from codemode_host.engine import (
    CellTool,
    Engine,
    EngineCell,
    Finished,
    Outcome,
    TextOutput,
    ToolCallRequested,
)

from benchmarks._measure import WorkloadError


async def until(cell: EngineCell, predicate: Callable[[object], bool]) -> object:
    """The first event that satisfies `predicate`; later events of its batch are dropped, so
    only use it where nothing the caller needs can follow in the same batch."""
    while True:
        for event in await cell.next_events():
            if predicate(event):
                return event


def finished(event: object) -> bool:
    return isinstance(event, Finished)


async def timed_source(engine: Engine, source: str) -> float:
    """Seconds from `start_cell(source)` to `Finished`, which must be a success."""
    start = time.perf_counter()
    with engine.start_cell(source) as cell:
        event = await until(cell, finished)
    elapsed = time.perf_counter() - start
    assert isinstance(event, Finished)
    if event.outcome is not Outcome.OK:
        raise WorkloadError(f"the engine cell failed: {event}")
    return elapsed


async def round_trip(engine: Engine) -> float:
    return await timed_source(engine, 'text("hi")')


async def tool_turns(engine: Engine, turns: int) -> list[float]:
    source = f"for (let i = 0; i < {turns + 1}; i++) await tools.echo({{}});"
    timings = []
    with engine.start_cell(source, tools=[CellTool("echo")]) as cell:
        call = await until(cell, lambda e: isinstance(e, ToolCallRequested))
        for _ in range(turns):
            assert isinstance(call, ToolCallRequested)
            start = time.perf_counter()
            cell.settle_tool_call(call.call_id, b"{}")
            call = await until(cell, lambda e: isinstance(e, ToolCallRequested))
            timings.append(time.perf_counter() - start)
        cell.interrupt()
        await until(cell, finished)
    return timings


async def interrupt(engine: Engine, source: str) -> float:
    """Seconds from `interrupt()` to `Finished(INTERRUPTED)` of a cell that says `text()` and
    then computes without end (`source` after the text)."""
    with engine.start_cell(f'text("go"); {source}') as cell:
        await until(cell, lambda e: isinstance(e, TextOutput))
        start = time.perf_counter()
        cell.interrupt()
        event = await until(cell, finished)
        elapsed = time.perf_counter() - start
    assert isinstance(event, Finished)
    if event.outcome is not Outcome.INTERRUPTED:
        raise WorkloadError(f"the engine cell was not interrupted: {event}")
    return elapsed
