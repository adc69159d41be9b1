"""Cold start (item 8 of issue 10's table): `open_process_provider()` entered -> the first
`Completed` (the host is spawned on the first session, so this is spawn + imports + handshake +
session + first cell), against a child process that imports trio and msgspec and answers one
frame (`_floors.cold_start`). The two alternate, so that both see the same machine. Goal
(issue 10): <= 1.2x the floor.

The host's modules (`codemode`, `codemode_host`) are compiled to bytecode first, as pip does
when it installs a wheel, and as the floor's trio and msgspec were: an editable install run
under `PYTHONDONTWRITEBYTECODE=1` keeps no bytecode and compiles every module of the host at
each start (about 50 ms more on the development machine), which measures the checkout, not the
host.

Run: `python -m benchmarks.startup_bench [--quick]` (from the repository's root).
"""

from __future__ import annotations

import compileall
import importlib.util
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


def compile_bytecode() -> None:
    """Write the bytecode of the host's packages where it is missing or stale."""
    for package in ("codemode", "codemode_host"):
        spec = importlib.util.find_spec(package)
        assert spec is not None
        assert spec.submodule_search_locations is not None
        for directory in spec.submodule_search_locations:
            compileall.compile_dir(directory, quiet=1)


async def figures(config: Config) -> list[Figure]:
    compile_bytecode()
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
            note="the host's modules compiled to bytecode first, as an installed wheel has them",
        )
    ]


if __name__ == "__main__":
    standalone(figures)
