"""In-process provider figures, beside the bare engine measured in the same run.

- execute -> initial response of a trivial cell (`text(1)`), against the engine's own
  start -> Finished round trip: the ratio is what sessions, observers and tasks add;
- execute -> response of a cell awaiting one nested tool call;
- cells per second with 64 sessions each running cells back to back.

Run: `python benchmarks/runtime_bench.py`.
"""

from __future__ import annotations

import statistics
import time

import trio
from codemode_host.engine import Finished, open_engine

import codemode
from codemode import ExecuteRequest, JsonValue, NestedToolCall, ToolDefinition, ToolName


class Delegate:
    async def invoke_tool(self, call: NestedToolCall) -> JsonValue:
        return {"value": "output"}

    async def notify(self, call_id: str, cell_id: str, text: str) -> None:
        pass

    def cell_closed(self, cell_id: str) -> None:
        pass


TOOL = ToolDefinition(name="t", tool_name=ToolName.plain("t"))


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


async def main() -> None:
    delegate = Delegate()
    baseline = await engine_round_trips(2000)
    async with codemode.open_in_process_provider() as provider:
        session = await provider.create_session()

        async def execute(source: str, tools: list[ToolDefinition]) -> float:
            start = time.perf_counter()
            request = ExecuteRequest(tool_call_id="c", source=source, enabled_tools=tools)
            started = await session.execute(request, delegate)
            await started.initial_response()
            return time.perf_counter() - start

        for _ in range(200):
            await execute("text(1)", [])
        trivial = [await execute("text(1)", []) for _ in range(2000)]
        with_tool = [await execute("text((await tools.t({})).value)", [TOOL]) for _ in range(2000)]

        sessions = [await provider.create_session() for _ in range(64)]
        total = 0
        start = time.perf_counter()

        async def drive(each: codemode.Session) -> None:
            nonlocal total
            for _ in range(100):
                request = ExecuteRequest(tool_call_id="c", source="text((await tools.t({})).value)",
                                         enabled_tools=[TOOL])  # fmt: skip
                started = await each.execute(request, delegate)
                await started.initial_response()
                total += 1

        async with trio.open_nursery() as nursery:
            for each in sessions:
                nursery.start_soon(drive, each)
        rate = total / (time.perf_counter() - start)

    median = statistics.median
    print(
        f"execute -> response, trivial cell: median {ms(median(trivial))}"
        f"   baseline engine start -> Finished {ms(median(baseline))}"
        f"   ratio {median(trivial) / median(baseline):.2f}"
    )
    print(f"execute -> response, one nested tool call: median {ms(median(with_tool))}")
    print(f"64 sessions, cells with one tool call each: {rate:8.0f} cells/s")


if __name__ == "__main__":
    trio.run(main)
