"""Cells per second with 1, 8 and 64 concurrent sessions (item 5 of issue 10's table), with the
CPU time each component spends per cell.

Each session runs cells of one tool call (`await tools.echo({})`) back to back, awaiting each
initial response, until the run's time is up; cells/s counts every cell finished over the whole
run. CPU per cell comes from /proc (`_proc.py`): the client process (this one; in-process its
engine workers are here too) and the host process, each split into its trio thread, trio's
thread cache and the engine workers; and how often each side's trio thread was preempted per
cell (its involuntary context switches: engine rule 13 is why workers rarely do it). Both
providers are open at once and measured one after the other at each number of sessions; the
in-process provider is the process provider's reference. The thin host (`_thin.py`: trio,
msgspec and the bare engine in a child, none of codemode's layers) runs the same cells beside
them: the least a host on this engine costs, and how far the goal is from it. Goal (issue 10):
>= 6,000 cells/s with 64 sessions on the 2-core machine (stretch 10,000).

Run: `python -m benchmarks.throughput_bench [--quick]` (from the repository's root).
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Awaitable, Callable

import trio

from benchmarks import _proc, _thin
from benchmarks._cells import PROVIDERS, Delegate, run_cell
from benchmarks._measure import Config, Figure, figure, single, standalone
from codemode import Session

SESSIONS = (1, 8, 64)
THIN_HOST = "thin-host"
CELL = 'await tools.echo({}); text("ok")'


class Run:
    """One measured run: cells finished, wall seconds, CPU microseconds per component, and how
    often each side's trio thread was preempted."""

    def __init__(
        self, cells: int, seconds: float, cpu: dict[str, float], preempted: dict[str, int]
    ) -> None:
        self.cells = cells
        self.seconds = seconds
        self.cpu = cpu
        self.preempted = preempted

    @property
    def rate(self) -> float:
        return self.cells / self.seconds


CellRunner = Callable[[], Awaitable[object]]
"""Runs one cell of `CELL` to its end, in one session."""


async def _drive(runners: list[CellRunner], seconds: float) -> tuple[int, float]:
    """Every runner's cells back to back, all runners at once, for `seconds`: the cells
    finished and the wall seconds it took."""
    finished = 0
    start = time.perf_counter()
    deadline = start + seconds

    async def loop(run: CellRunner) -> None:
        nonlocal finished
        while time.perf_counter() < deadline:
            await run()
            finished += 1

    async with trio.open_nursery() as nursery:
        for run in runners:
            nursery.start_soon(loop, run)
    return finished, time.perf_counter() - start


def _samples(host: int | None) -> dict[str, _proc.CpuSample]:
    samples = {"client": _proc.CpuSample(os.getpid())}
    if host is not None:
        samples["host"] = _proc.CpuSample(host)
    return samples


async def _measure(config: Config) -> dict[str, dict[int, Run]]:
    """Both providers and the thin host open at once, measured one after the other at each
    number of sessions."""
    seconds = 3.0 if config.mode == "full" else 1.0 if config.mode == "quick" else 0.2
    delegate = Delegate()
    runs: dict[str, dict[int, Run]] = {name: {} for name in (*PROVIDERS, THIN_HOST)}
    async with contextlib.AsyncExitStack() as stack:
        runners: dict[str, list[CellRunner]] = {}
        hosts: dict[str, int | None] = {}
        for name, opener in PROVIDERS.items():
            provider = await stack.enter_async_context(opener())
            sessions: list[Session] = [
                await provider.create_session() for _ in range(max(SESSIONS))
            ]
            runners[name] = [
                functools.partial(run_cell, session, CELL, delegate, ["echo"])
                for session in sessions
            ]
            await _drive(runners[name], seconds / 3)  # warm up every session
            hosts[name] = _proc.child_running("codemode_host") if name == "process" else None
        thin = await stack.enter_async_context(_thin.open_thin_host())
        runners[THIN_HOST] = [functools.partial(thin.run_cell, CELL)] * max(SESSIONS)
        await _drive(runners[THIN_HOST], seconds / 3)
        hosts[THIN_HOST] = thin.process.pid
        for count in SESSIONS:
            for name, opened in runners.items():
                watched = hosts[name]
                before = _samples(watched)
                cells, wall = await _drive(opened[:count], seconds)
                after = _samples(watched)
                cpu = {}
                preempted = {}
                for side, start in before.items():
                    for component, used in _proc.cpu_by_component(start, after[side]).items():
                        cpu[f"{side} {component}"] = used
                    preempted[side] = after[side].trio_preempted - start.trio_preempted
                runs[name][count] = Run(cells, wall, cpu, preempted)
    return runs


def _details(run: Run) -> dict[str, float]:
    details = {
        f"{component} us/cell": used / run.cells for component, used in run.cpu.items() if used
    }
    total = sum(run.cpu.values())
    details["CPU us/cell"] = total / run.cells
    details["cores busy"] = total / 1e6 / run.seconds
    for side, count in run.preempted.items():
        details[f"{side} trio preempted/cell"] = count / run.cells
    details["cells"] = run.cells
    return details


async def figures(config: Config) -> list[Figure]:
    measured = await _measure(config)
    out = []
    for name, runs in measured.items():
        for count, run in runs.items():
            process = name == "process"
            reference = measured["in-process"][count]
            sessions = f"{count} session{'s' if count > 1 else ''}"
            out.append(
                figure(
                    f"throughput/{count}/{name}",
                    5,
                    f"cells/s, {sessions}, one tool call, "
                    + (_thin.LABEL if name == THIN_HOST else name),
                    "cells/s",
                    single(run.rate),
                    single(reference.rate) if name != "in-process" else None,
                    f"in-process provider, {sessions}, same run" if name != "in-process" else None,
                    higher_is_better=True,
                    goal=">= 6,000 cells/s (stretch 10,000)" if process and count == 64 else None,
                    details=_details(run),
                )
            )
    return out


if __name__ == "__main__":
    standalone(figures)
