"""The end-to-end CPU goal measured in pairs: CPU microseconds a cell through the process
provider and through the thin host, at 64 sessions, in short windows that alternate.

The throughput table (`throughput_bench.py`) measures each for 3 s, one after the other. On a
shared 2-core machine whose speed drifts over seconds that pairs each figure with a different
machine: six runs of one build gave ratios from 0.93x to 1.66x. Here each window of the process
provider sits between two of the thin host, both run the same cells (`throughput_bench.CELL`),
and the figure is the median of the ratios of each process window to the mean of the thin-host
windows on either side of it. The components (client trio, host trio, engine workers) are
printed as medians of the same windows, and so are the cells each side ran a second: both keep
the machine's two cores busy, so a window whose CPU a cell is higher is one that ran fewer
cells, and the throughput shows whether a high ratio is the whole window running slower.

Run: `python -m benchmarks.paired_cpu [--pairs 20] [--window 0.5] [--sessions 64]` (from the
repository's root; about `2 * pairs * window` seconds and the warm-up).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import statistics
from collections.abc import Sequence

import trio

from benchmarks import _proc, _thin
from benchmarks._cells import Delegate, run_cell
from benchmarks.throughput_bench import CELL, CellRunner, _drive, _samples
from codemode import open_process_provider

COMPONENTS = {"client trio": "client trio", "host trio": "host trio", "workers": "host engine"}
"""The printed name of each component, and the start of its name in `cpu_by_component`'s
keys (prefixed by the side)."""


class Window:
    """One measured window: CPU microseconds a cell, in total and per component, and the
    cells it ran a second."""

    def __init__(self, cells: int, cpu: dict[str, float], seconds: float) -> None:
        if cells == 0:
            raise RuntimeError("no cell finished in a window: make the window longer")
        self.total = sum(cpu.values()) / cells
        self.rate = cells / seconds
        self.parts = {
            name: sum(used for key, used in cpu.items() if key.startswith(prefix)) / cells
            for name, prefix in COMPONENTS.items()
        }


async def _window(runners: list[CellRunner], host: int, seconds: float) -> Window:
    before = _samples(host)
    cells, elapsed = await _drive(runners, seconds)
    after = _samples(host)
    cpu = {}
    for side, start in before.items():
        for component, used in _proc.cpu_by_component(start, after[side]).items():
            cpu[f"{side} {component}"] = used
    return Window(cells, cpu, elapsed)


async def measure(pairs: int, window: float, sessions: int) -> list[tuple[Window, Window]]:
    """`pairs` windows of each, alternating thin host and process provider (thin first and
    last): each process window with the mean of the thin windows around it."""
    delegate = Delegate()
    async with contextlib.AsyncExitStack() as stack:
        provider = await stack.enter_async_context(open_process_provider())
        opened = [await provider.create_session() for _ in range(sessions)]
        process: list[CellRunner] = [
            functools.partial(run_cell, s, CELL, delegate, ["echo"]) for s in opened
        ]
        thin = await stack.enter_async_context(_thin.open_thin_host())
        thin_runners: list[CellRunner] = [functools.partial(thin.run_cell, CELL)] * sessions
        await _drive(process, 1.0)  # warm up every session, both sides
        await _drive(thin_runners, 1.0)
        host = _proc.child_running("codemode_host")
        thins = [await _window(thin_runners, thin.process.pid, window)]
        processes = []
        for _ in range(pairs):
            processes.append(await _window(process, host, window))
            thins.append(await _window(thin_runners, thin.process.pid, window))
    return [
        (measured, _mean(thins[index], thins[index + 1]))
        for index, measured in enumerate(processes)
    ]


def _mean(first: Window, second: Window) -> Window:
    mean = Window.__new__(Window)
    mean.total = (first.total + second.total) / 2
    mean.rate = (first.rate + second.rate) / 2
    mean.parts = {name: (first.parts[name] + second.parts[name]) / 2 for name in first.parts}
    return mean


def render(measured: Sequence[tuple[Window, Window]]) -> str:
    """Each pair, then the medians: the process provider's CPU a cell over the thin host's."""
    lines = [
        f"{'pair':>4}  {'process':>8}  {'thin':>8}  {'ratio':>6}  {'cells/s':>11}"
        "  components (process / thin)"
    ]
    for number, (process, thin) in enumerate(measured, 1):
        parts = ", ".join(
            f"{name} {process.parts[name]:.1f} / {thin.parts[name]:.1f}" for name in COMPONENTS
        )
        ratio = process.total / thin.total
        rates = f"{process.rate:>5.0f}/{thin.rate:<5.0f}"
        lines.append(
            f"{number:>4}  {process.total:>8.1f}  {thin.total:>8.1f}  {ratio:>5.3f}x  {rates}"
            f"  {parts}"
        )
    ratios = [process.total / thin.total for process, thin in measured]
    medians = ", ".join(
        f"{name} {statistics.median(p.parts[name] for p, _ in measured):.1f}"
        f" / {statistics.median(t.parts[name] for _, t in measured):.1f}"
        for name in COMPONENTS
    )
    process_cpu = statistics.median(process.total for process, _ in measured)
    thin_cpu = statistics.median(thin.total for _, thin in measured)
    process_rate = statistics.median(process.rate for process, _ in measured)
    thin_rate = statistics.median(thin.rate for _, thin in measured)
    lines.append(
        f"median ratio {statistics.median(ratios):.3f}x (min {min(ratios):.3f}x,"
        f" max {max(ratios):.3f}x); CPU us a cell {process_cpu:.1f} / {thin_cpu:.1f};"
        f" cells a second {process_rate:.0f} / {thin_rate:.0f}; {medians}"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="CPU a cell: process provider / thin host")
    parser.add_argument("--pairs", type=int, default=20, help="windows of each")
    parser.add_argument("--window", type=float, default=0.5, help="seconds a window")
    parser.add_argument("--sessions", type=int, default=64, help="sessions running at once")
    arguments = parser.parse_args(argv)
    measured = trio.run(measure, arguments.pairs, arguments.window, arguments.sessions)
    print(render(measured))


if __name__ == "__main__":
    main()
