"""Cells per second with 1, 8 and 64 concurrent sessions (item 5 of issue 10's table), with the
CPU time each component spends per cell.

Each session runs cells of one tool call (`await tools.echo({})`) back to back, awaiting each
initial response, until the run's time is up; cells/s counts every cell finished over the whole
run. CPU per cell comes from /proc (`_proc.py`): the client process (this one; in-process its
engine workers are here too) and the host process, each split into its trio thread, trio's
thread cache and the engine workers; and how often each side's trio thread was preempted per
cell (its involuntary context switches: engine rule 13 is why workers rarely do it). Both
providers are open at once and measured one after the other at each number of sessions; the
in-process provider is the process provider's reference. Goal (issue 10): >= 6,000 cells/s
with 64 sessions on the 2-core machine (stretch 10,000).

Run: `python -m benchmarks.throughput_bench [--quick]` (from the repository's root).
"""

from __future__ import annotations

import contextlib
import os
import time

import trio

from benchmarks import _proc
from benchmarks._cells import PROVIDERS, Delegate, run_cell
from benchmarks._measure import Config, Figure, figure, single, standalone
from codemode import Session

SESSIONS = (1, 8, 64)
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


async def _drive(sessions: list[Session], delegate: Delegate, seconds: float) -> tuple[int, float]:
    finished = 0
    start = time.perf_counter()
    deadline = start + seconds

    async def loop(session: Session) -> None:
        nonlocal finished
        while time.perf_counter() < deadline:
            await run_cell(session, CELL, delegate, ["echo"])
            finished += 1

    async with trio.open_nursery() as nursery:
        for session in sessions:
            nursery.start_soon(loop, session)
    return finished, time.perf_counter() - start


def _samples(host: int | None) -> dict[str, _proc.CpuSample]:
    samples = {"client": _proc.CpuSample(os.getpid())}
    if host is not None:
        samples["host"] = _proc.CpuSample(host)
    return samples


async def _measure(config: Config) -> dict[str, dict[int, Run]]:
    """Both providers open at once, measured one after the other at each number of sessions."""
    seconds = 3.0 if config.mode == "full" else 1.0 if config.mode == "quick" else 0.2
    delegate = Delegate()
    runs: dict[str, dict[int, Run]] = {name: {} for name in PROVIDERS}
    async with contextlib.AsyncExitStack() as stack:
        sessions: dict[str, list[Session]] = {}
        for name, opener in PROVIDERS.items():
            provider = await stack.enter_async_context(opener())
            sessions[name] = [await provider.create_session() for _ in range(max(SESSIONS))]
            await _drive(sessions[name], delegate, seconds / 3)  # warm up every session
        host = _proc.child_running("codemode_host")
        for count in SESSIONS:
            for name, opened in sessions.items():
                watched = host if name == "process" else None
                before = _samples(watched)
                cells, wall = await _drive(opened[:count], delegate, seconds)
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
            out.append(
                figure(
                    f"throughput/{count}/{name}",
                    5,
                    f"cells/s, {count} session{'s' if count > 1 else ''}, one tool call, {name}",
                    "cells/s",
                    single(run.rate),
                    single(reference.rate) if process else None,
                    f"in-process provider, {count} session{'s' if count > 1 else ''}, same run"
                    if process
                    else None,
                    higher_is_better=True,
                    goal=">= 6,000 cells/s (stretch 10,000)" if process and count == 64 else None,
                    details=_details(run),
                )
            )
    return out


if __name__ == "__main__":
    standalone(figures)
