"""Engine figures, each printed beside a baseline measured in the same run.

Figures (issue "the package and the QuickJS engine"):
- cell creation: runtime + context + globals, timed on the worker (`Started.setup_ns`);
- fib(30) in a cell, against the same function in CPython;
- interrupt latency of `while (true) {}`: from `interrupt()` to the trio task holding
  `Finished(INTERRUPTED)`, median and max over 50 runs;
- a submit-run-collect round trip: a trivial cell (`1`) from `start_cell` to `Finished`, and one
  tool-call turn of a warm cell (settle, run, next event), against a `trio.to_thread.run_sync`
  no-op, the per-turn hand-off the design avoids (engine-notes section 3);
- throughput: trivial cells per second with 64 in flight.

Run: `python benchmarks/engine_bench.py` (no assertions: speed is reported, never asserted).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import trio
from codemode_host.engine import (
    CellTool,
    Engine,
    EngineCell,
    Finished,
    Outcome,
    Started,
    TextOutput,
    ToolCallRequested,
    open_engine,
)

FIB = "function fib(n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }"


def fib(n: int) -> int:
    return n if n < 2 else fib(n - 1) + fib(n - 2)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:8.3f} ms"


async def until(cell: EngineCell, predicate: Callable[[object], bool]) -> object:
    """The first event that satisfies `predicate`; later events of its batch are dropped, so
    only use it where nothing the caller needs can follow in the same batch."""
    while True:
        for event in await cell.next_events():
            if predicate(event):
                return event


async def all_events(cell: EngineCell) -> list[object]:
    events: list[object] = []
    while not events or not finished(events[-1]):
        events.extend(await cell.next_events())
    return events


def finished(event: object) -> bool:
    return isinstance(event, Finished)


async def run_trivial(engine: Engine) -> float:
    start = time.perf_counter()
    with engine.start_cell("1") as cell:
        await until(cell, finished)
    return time.perf_counter() - start


async def cell_creation(engine: Engine, runs: int) -> list[float]:
    setups = []
    for _ in range(runs):
        with engine.start_cell("1") as cell:
            started = (await all_events(cell))[0]
            assert isinstance(started, Started)
            setups.append(started.setup_ns / 1e9)
    return setups


async def fib30(engine: Engine) -> float:
    start = time.perf_counter()
    with engine.start_cell(f"{FIB} text(fib(30))") as cell:
        await until(cell, finished)
    return time.perf_counter() - start


async def interrupt_latency(engine: Engine) -> float:
    with engine.start_cell('text("spin"); while (true) {}') as cell:
        await until(cell, lambda e: isinstance(e, TextOutput))
        start = time.perf_counter()
        cell.interrupt()
        event = await until(cell, finished)
        elapsed = time.perf_counter() - start
        assert isinstance(event, Finished)
        assert event.outcome is Outcome.INTERRUPTED
    return elapsed


async def tool_turns(engine: Engine, turns: int) -> list[float]:
    source = f"for (let i = 0; i < {turns + 1}; i++) await tools.t();"
    timings = []
    with engine.start_cell(source, tools=[CellTool("t")]) as cell:
        call = await until(cell, lambda e: isinstance(e, ToolCallRequested))
        for _ in range(turns):
            assert isinstance(call, ToolCallRequested)
            start = time.perf_counter()
            cell.settle_tool_call(call.call_id, b"null")
            call = await until(cell, lambda e: isinstance(e, ToolCallRequested))
            timings.append(time.perf_counter() - start)
        cell.interrupt()
        await until(cell, finished)
    return timings


async def throughput(engine: Engine, total: int, in_flight: int) -> float:
    remaining = total

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            await run_trivial(engine)

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(in_flight):
            nursery.start_soon(worker)
    return total / (time.perf_counter() - start)


async def to_thread_round_trips(runs: int) -> list[float]:
    timings = []
    for _ in range(runs):
        start = time.perf_counter()
        await trio.to_thread.run_sync(lambda: None)
        timings.append(time.perf_counter() - start)
    return timings


async def main() -> None:
    async with open_engine() as engine:
        for _ in range(200):  # warm up: threads, allocator, caches
            await run_trivial(engine)
        setups = await cell_creation(engine, 500)
        trivial = [await run_trivial(engine) for _ in range(500)]
        turns = await tool_turns(engine, 500)
        handoffs = await to_thread_round_trips(500)
        fib_js = min([await fib30(engine) for _ in range(3)])
        start = time.perf_counter()
        fib(30)
        fib_py = time.perf_counter() - start
        latencies = [await interrupt_latency(engine) for _ in range(50)]
        rate = await throughput(engine, 20_000, 64)
        rate_1 = await throughput(engine, 5_000, 1)

    median = statistics.median
    handoff = median(handoffs)
    print(f"engine: QuickJS-ng {__import__('codemode_host._quickjs')._quickjs.QUICKJS_VERSION}")
    print(f"cell creation (runtime+context+globals), median {ms(median(setups))}")
    print(f"trivial cell round trip (start -> Finished), median {ms(median(trivial))}")
    print(
        f"tool-call turn (settle -> next call), median {ms(median(turns))}"
        f"   baseline trio.to_thread no-op {ms(handoff)}"
        f"   ratio {median(turns) / handoff:.2f}"
    )
    print(
        f"fib(30) in a cell {ms(fib_js)}   baseline CPython {ms(fib_py)}"
        f"   ratio {fib_js / fib_py:.2f}"
    )
    print(
        f"interrupt latency (interrupt -> Finished in trio) over 50: median"
        f" {ms(median(latencies))}, max {ms(max(latencies))}"
    )
    print(f"trivial cells/s, 64 in flight {rate:10.0f}   1 in flight {rate_1:10.0f}")


if __name__ == "__main__":
    trio.run(main)
