"""Model turns a long, quiet cell costs, with and without cheaper waiting, side by side.

Every empty `wait` answer is a model turn that re-bills the model's whole context. A scripted
model runs one cell that lasts `--seconds` (30 by default) and prints one line every `--every`
seconds (10): it calls `exec` asking for a short window (`--window-ms`, 1000, a common choice of
models), then calls `wait` with the same window until the cell has ended. Both configurations
run at once, each on its own session of the same provider:

- the reference behaviour (`CodeMode` without options);
- cheaper waiting (`min_yield_time_ms=10_000`, `max_empty_wait_ms=60_000`).

Printed: model turns (tool calls), empty answers among them, wall time, and the ratio of turns.

Run: `python benchmarks/waiting_bench.py [--seconds 30] [--every 10] [--window-ms 1000]
[--process]`.
"""

from __future__ import annotations

import argparse
import time
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

import trio

import codemode
from codemode import CodeMode, InputText, JsonValue, NestedToolCall, Session, ToolOutput

CHEAPER = {"min_yield_time_ms": 10_000, "max_empty_wait_ms": 60_000}


class Delegate:
    async def invoke_tool(self, call: NestedToolCall) -> JsonValue:
        return None

    async def notify(self, call_id: str, cell_id: str, text: str) -> None:
        pass

    def cell_closed(self, cell_id: str) -> None:
        pass


def cell_source(seconds: int, every: int, window_ms: int) -> str:
    return f"""// @exec: {{"yield_time_ms": {window_ms}}}
const started = Date.now();
for (let tick = 1; tick * {every} <= {seconds}; tick++) {{
  await new Promise((resolve) => setTimeout(resolve, started + tick * {every * 1000} - Date.now()));
  text(`tick ${{tick}} at ${{Math.round((Date.now() - started) / 1000)}} s`);
}}
"""


@dataclass
class Run:
    turns: int = 0
    empty: int = 0
    wall: float = 0.0


def is_empty(output: ToolOutput) -> bool:
    return len(output.items) == 1 and isinstance(output.items[0], InputText)


async def scripted_model(
    session: Session, options: dict[str, Any], source: str, window_ms: int
) -> Run:
    code_mode = CodeMode(session, Delegate(), [], **options)
    run = Run()
    start = time.perf_counter()
    output = await code_mode.exec("call-1", source)
    while True:
        run.turns += 1
        run.empty += is_empty(output)
        if output.status != "running":
            break
        output = await code_mode.wait({"cell_id": output.cell_id, "yield_time_ms": window_ms})
    run.wall = time.perf_counter() - start
    assert output.status == "completed", output.text
    return run


async def main(arguments: argparse.Namespace) -> None:
    source = cell_source(arguments.seconds, arguments.every, arguments.window_ms)
    provider: AbstractAsyncContextManager[Any] = (
        codemode.open_process_provider()
        if arguments.process
        else codemode.open_in_process_provider()
    )
    runs: dict[str, Run] = {}
    async with provider as opened:

        async def measure(name: str, options: dict[str, Any]) -> None:
            session = await opened.create_session()
            runs[name] = await scripted_model(session, options, source, arguments.window_ms)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(measure, "reference behaviour", {})
            nursery.start_soon(measure, "cheaper waiting", CHEAPER)
    kind = "process" if arguments.process else "in-process"
    print(
        f"cell: {arguments.seconds} s, one line every {arguments.every} s; the model asks for "
        f"{arguments.window_ms} ms windows; {kind} provider"
    )
    print(f"cheaper waiting: {', '.join(f'{key}={value}' for key, value in CHEAPER.items())}")
    print(f"{'':22}{'turns':>7}{'empty':>7}{'wall s':>9}")
    for name in ("reference behaviour", "cheaper waiting"):
        run = runs[name]
        print(f"{name:22}{run.turns:>7}{run.empty:>7}{run.wall:>9.1f}")
    ratio = runs["reference behaviour"].turns / runs["cheaper waiting"].turns
    print(f"{'turns ratio':22}{ratio:>6.1f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=30, help="how long the cell runs")
    parser.add_argument("--every", type=int, default=10, help="seconds between its lines")
    parser.add_argument("--window-ms", type=int, default=1000, help="the model's window")
    parser.add_argument("--process", action="store_true", help="use the process provider")
    trio.run(main, parser.parse_args())
