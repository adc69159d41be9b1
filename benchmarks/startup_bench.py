"""Cold start (item 8 of issue 10's table): `open_process_provider()` entered -> the first
`Completed` (the host is spawned on the first session, so this is spawn + imports + handshake +
session + first cell), against a child process that imports trio and msgspec and answers one
frame (`_floors.cold_start`). The two alternate, so that both see the same machine. Goal
(issue 10): <= 1.2x the floor.

Run: `python -m benchmarks.startup_bench [--quick]` (from the repository's root).
"""

from __future__ import annotations

import time

import codemode
from benchmarks import _floors
from benchmarks._cells import Delegate, run_cell
from benchmarks._measure import MS, Config, Figure, figure, standalone, stats


async def _cold_start(delegate: Delegate) -> float:
    start = time.perf_counter()
    async with codemode.open_process_provider() as provider:
        session = await provider.create_session()
        await run_cell(session, 'text("hi")', delegate)
        elapsed = time.perf_counter() - start
    return elapsed


async def figures(config: Config) -> list[Figure]:
    delegate = Delegate()
    starts: list[float] = []
    floors: list[float] = []
    await _floors.cold_start()  # warm the page cache for both
    await _cold_start(delegate)
    for _ in range(config.n(10, 3)):
        floors.append(await _floors.cold_start())
        starts.append(await _cold_start(delegate))
    return [
        figure(
            "cold_start",
            8,
            "cold start: open_process_provider() -> first Completed",
            "ms",
            stats(starts, MS),
            stats(floors, MS),
            "spawn a child importing trio+msgspec, one frame answered",
            goal="<= 1.2x floor",
        )
    ]


if __name__ == "__main__":
    standalone(figures)
