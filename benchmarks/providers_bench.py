"""Provider figures: the in-process provider and the process provider side by side, with the
bare engine as the baseline, all measured in the same run.

- execute -> initial response of a trivial cell (`text(1)`), and of a cell awaiting one nested
  tool call;
- cells per second with 64 sessions, each running one-tool cells back to back;
- (process provider) spawn + handshake + first response of a fresh host.

Run: `python benchmarks/providers_bench.py`.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import trio
from codemode_host.engine import Finished, open_engine

import codemode
from codemode import ExecuteRequest, JsonValue, NestedToolCall, Session, ToolDefinition, ToolName


class Delegate:
    async def invoke_tool(self, call: NestedToolCall) -> JsonValue:
        return {"value": "output"}

    async def notify(self, call_id: str, cell_id: str, text: str) -> None:
        pass

    def cell_closed(self, cell_id: str) -> None:
        pass


DELEGATE = Delegate()
TOOL = ToolDefinition(name="t", tool_name=ToolName.plain("t"))
WITH_TOOL = "text((await tools.t({})).value)"


def ms(seconds: float) -> str:
    return f"{seconds * 1000:7.3f} ms"


async def engine_round_trips(runs: int) -> list[float]:
    timings = []
    async with open_engine() as engine:
        for _ in range(runs):
            start = time.perf_counter()
            with engine.start_cell("text(1)") as cell:
                while not any(isinstance(e, Finished) for e in await cell.next_events()):
                    pass
            timings.append(time.perf_counter() - start)
    return timings


async def execute(session: Session, source: str, tools: list[ToolDefinition]) -> float:
    start = time.perf_counter()
    request = ExecuteRequest(tool_call_id="c", source=source, enabled_tools=tools)
    started = await session.execute(request, DELEGATE)
    await started.initial_response()
    return time.perf_counter() - start


async def measure(
    open_provider: Callable[[], AbstractAsyncContextManager[Any]],
) -> dict[str, float]:
    async with open_provider() as provider:
        session = await provider.create_session()
        for _ in range(200):
            await execute(session, "text(1)", [])
        trivial = [await execute(session, "text(1)", []) for _ in range(1000)]
        with_tool = [await execute(session, WITH_TOOL, [TOOL]) for _ in range(1000)]
        sessions = [await provider.create_session() for _ in range(64)]
        total = 0
        start = time.perf_counter()

        async def drive(each: Session) -> None:
            nonlocal total
            for _ in range(50):
                await execute(each, WITH_TOOL, [TOOL])
                total += 1

        async with trio.open_nursery() as nursery:
            for each in sessions:
                nursery.start_soon(drive, each)
        rate = total / (time.perf_counter() - start)
    return {
        "trivial": statistics.median(trivial),
        "tool": statistics.median(with_tool),
        "rate": rate,
    }


async def first_response_of_a_fresh_host() -> float:
    start = time.perf_counter()
    async with codemode.open_process_provider() as provider:
        session = await provider.create_session()
        await execute(session, "text(1)", [])
        return time.perf_counter() - start


async def main() -> None:
    baseline = statistics.median(await engine_round_trips(1000))
    in_process = await measure(codemode.open_in_process_provider)
    process = await measure(codemode.open_process_provider)
    spawn = statistics.median([await first_response_of_a_fresh_host() for _ in range(5)])

    print(f"bare engine, start -> Finished of text(1): median {ms(baseline)}")
    for name, figures in (("in-process", in_process), ("process", process)):
        print(
            f"{name:>10}: execute -> response {ms(figures['trivial'])}"
            f" (x{figures['trivial'] / baseline:.2f} engine)"
            f"   with one tool call {ms(figures['tool'])}"
            f"   64 sessions {figures['rate']:7.0f} cells/s"
        )
    print(
        f"process / in-process: trivial x{process['trivial'] / in_process['trivial']:.2f},"
        f" tool x{process['tool'] / in_process['tool']:.2f},"
        f" throughput x{process['rate'] / in_process['rate']:.2f}"
    )
    print(f"fresh host: spawn + handshake + first response, median of 5 {ms(spawn)}")


if __name__ == "__main__":
    trio.run(main)
