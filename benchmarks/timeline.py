"""Where the time of one execute goes: the timeline of sequential `text("hi")` cells through the
process provider and through the thin host (`_thin.py`), from timestamps both processes take.

Both sides record, in memory, every read and write of the process and a few steps
(`_timeline_probe.py`); the clock (`CLOCK_MONOTONIC`) is the machine's, so the events merge into
one timeline per cell, from the client's call. The cells whose events came in the most common
order are summarised: the median time of each event after the call, and the median step from
the event before. Labels:

    C0  the client starts the cell (`execute`; the thin host: `run_cell`)
    W   the client writes            R   the client reads
    r   the host reads               w   the host writes
    s0  `Engine.start_cell` called   s1  it returned
    d   the host dispatched a batch of the engine's events
    i   the host's trio thread is out of work: it enters trio's epoll wait with a timeout
    C3  `execute` returned (`ExecutionStarted`; codemode only)
    C5  the cell's initial response returned (the thin host: its `DONE`)

The probes cost a list append each, a few hundred nanoseconds: the steps are comparable, the
total is a little above `latency_bench.py`'s. Not a table figure: a profile, for the closing
notes of issue 10's rounds.

Run: `python -m benchmarks.timeline [--cells 2000]` (from the repository's root).
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import NamedTuple

import trio

import codemode
from benchmarks import _thin
from benchmarks._cells import Delegate, request
from benchmarks._timeline_probe import Recorder, read_log

PROBE = Path(__file__).resolve().parent / "_timeline_probe.py"
TRIVIAL = 'text("hi")'
WARM = 200
"""Cells run before the recorded ones (threads, caches, the prepared pool)."""


class Step(NamedTuple):
    """One event of the usual order: median microseconds after `C0` and after the event
    before it."""

    label: str
    at: float
    after_previous: float


class Timeline(NamedTuple):
    """The usual order of events (labels numbered by occurrence: `w1`, `w2`), how many cells
    were recorded, how many came in that order, and its steps."""

    order: tuple[str, ...]
    cells: int
    usual: int
    steps: list[Step]


def summarise(events: Sequence[tuple[str, int]]) -> Timeline:
    """The timeline of the cells in `events` (both processes' events, any order): each cell
    runs from its `C0` to the next."""
    cells: list[list[tuple[str, int]]] = []
    for label, ns in sorted(events, key=lambda event: event[1]):
        if label == "C0":
            cells.append([])
        if cells:
            cells[-1].append((label, ns))
    orders: collections.Counter[tuple[str, ...]] = collections.Counter()
    numbered: list[tuple[tuple[str, ...], list[int]]] = []
    for cell in cells:
        seen: collections.Counter[str] = collections.Counter()
        labels = []
        for label, _ in cell:
            seen[label] += 1
            labels.append(f"{label}{seen[label]}")
        order = tuple(labels)
        orders[order] += 1
        numbered.append((order, [ns - cell[0][1] for _, ns in cell]))
    if not orders:
        raise ValueError("no cell was recorded")
    usual, count = orders.most_common(1)[0]
    columns = list(zip(*(times for order, times in numbered if order == usual), strict=True))
    steps = []
    for i, label in enumerate(usual):
        after = [b - a for a, b in zip(columns[i - 1], columns[i], strict=True)] if i else [0]
        steps.append(
            Step(label, statistics.median(columns[i]) / 1000, statistics.median(after) / 1000)
        )
    return Timeline(usual, len(cells), count, steps)


async def _record(cells: int, run: Callable[[], Awaitable[object]], recorder: Recorder) -> None:
    for _ in range(WARM):
        await run()
    recorder.record_io("R", "W")
    try:
        for _ in range(cells):
            recorder.mark("C0")
            await run()
            recorder.mark("C5")
    finally:
        recorder.stop()
    await run()  # the host writes its log as this cell starts


async def codemode_timeline(cells: int, directory: Path) -> Timeline:
    log = directory / "codemode-host.log"
    recorder = Recorder()
    command = [sys.executable, str(PROBE), "codemode", str(log), str(WARM + cells)]
    delegate = Delegate()
    async with codemode.open_process_provider(host_command=command) as provider:
        session = await provider.create_session()

        async def run() -> None:
            started = await session.execute(request(TRIVIAL), delegate)
            recorder.mark("C3")
            await started.initial_response()

        await _record(cells, run, recorder)
    return summarise(recorder.events + read_log(log))


async def thin_timeline(cells: int, directory: Path) -> Timeline:
    log = directory / "thin-host.log"
    recorder = Recorder()
    command = [sys.executable, str(PROBE), "thin", str(log), str(WARM + cells)]
    async with _thin.open_thin_host(command) as thin:
        await _record(cells, lambda: thin.run_cell(TRIVIAL), recorder)
    return summarise(recorder.events + read_log(log))


def render(name: str, timeline: Timeline) -> str:
    lines = [
        f"{name}: {timeline.usual} of {timeline.cells} cells in the usual order",
        f"  {'event':6} {'at us':>8} {'step us':>8}",
    ]
    for step in timeline.steps:
        lines.append(f"  {step.label:6} {step.at:8.1f} {step.after_previous:8.1f}")
    return "\n".join(lines)


async def measure(cells: int) -> dict[str, Timeline]:
    with tempfile.TemporaryDirectory(prefix="codemode-timeline-") as directory:
        return {
            "process provider": await codemode_timeline(cells, Path(directory)),
            "thin host": await thin_timeline(cells, Path(directory)),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=2000)
    args = parser.parse_args()
    timelines = trio.run(measure, args.cells)
    print("\n\n".join(render(name, timeline) for name, timeline in timelines.items()))


if __name__ == "__main__":
    main()
