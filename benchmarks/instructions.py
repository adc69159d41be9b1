"""Instructions per cell, counted by callgrind: the measure of a change to a cell's path that
timings on a noisy machine cannot show (a 5 % gain hides in the development VM's drift).

Each component's process runs twice under `valgrind --tool=callgrind --separate-threads=yes`:
with `WARM` cells, and with `WARM + cells` cells. The difference of the two counts, divided by
`cells`, is what one more cell costs: start-up, imports and teardown cancel out. Components:
- `client`: the process provider's side (the caller's process; the host runs natively);
- `host`: the host process (`codemode-host`; the caller runs natively);
- `in-process`: the in-process provider's process;
- `thin-client` and `thin-host`: the parent and the host of the thin host (`_thin.py`,
  `_thin_host.py`), the floor beside `client` and `host`: the same cells through a host of
  trio, msgspec and the bare engine without codemode's layers.

Each is reported for its trio thread (the process's main thread: the Python a cell costs) and
for its other threads together (in `host` and `in-process` the engine's workers and preparer).
Workloads: `text` is `text("hi")`; `tool` is one `await tools.echo({})` and then `text("ok")`.

`--sessions N` runs the cells in N sessions at once (each its own session, the thin host's
sharing its one connection, as `throughput_bench.py` does) instead of one after another. Under
valgrind the counted process is the slowest by far, so the other side answers at once and every
read and write carries as many frames as the sessions have waiting: what a cell costs once the
passes, reads and writes are shared among many cells, as at 64 sessions on a busy machine.

The count of one version varies by 1-3 % from run to run (how many scheduler passes a cell took
depends on timing, even under valgrind), now and then more: compare the medians of `--repeat 3`
or more. To compare two versions, run this in a checkout of each (`git worktree add`, with its
own virtual environment and build), one after the other, on a machine that is otherwise quiet.

`--tracing off,noop,memory` measures each row once per tracing mode of the counted process
(`codemode.observability`): `off` configures nothing (OpenTelemetry's API installed, no SDK: the
path of every application that does not trace), `noop` an SDK tracer and meter provider whose
spans go to an exporter that drops them and whose metrics nobody reads, `memory` the SDK's
in-memory span exporter and metric reader; each row then shows its ratio to `off`.

Run: `python -m benchmarks.instructions [--cells 400] [--repeat 1]
[--only client,host,in-process,thin-client,thin-host] [--workloads text,tool]
[--tracing off] [--sessions 1]` (from the repository's root; needs `valgrind` on the PATH;
about a minute per component, workload, tracing mode and repeat).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, TypeVar

import trio

import codemode
from benchmarks._cells import Delegate, run_cell
from codemode import ContentItem

T = TypeVar("T")

COMPONENTS = ("client", "host", "in-process", "thin-client", "thin-host")
WORKLOADS: dict[str, tuple[str, tuple[str, ...]]] = {
    "text": ('text("hi")', ()),
    "tool": ('await tools.echo({}); text("ok")', ("echo",)),
}
WARM = 20
"""Cells of the shorter run: the longer one's first cells are as warm as these."""
VALGRIND_TIMEOUT_S = 600
TRACING_MODES = ("off", "noop", "memory")
TRACING_VARIABLE = "CODEMODE_BENCH_TRACING"
"""How the counted child learns its tracing mode."""


def configure_tracing(mode: str) -> None:
    """Set codemode's OpenTelemetry providers for one tracing mode (`--tracing`)."""
    if mode == "off":
        return
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        SimpleSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    class Dropped(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    exporter = InMemorySpanExporter() if mode == "memory" else Dropped()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    readers = [InMemoryMetricReader()] if mode == "memory" else []
    meter_provider = MeterProvider(metric_readers=readers)
    from codemode import observability

    observability.configure(tracer_provider=tracer_provider, meter_provider=meter_provider)


def callgrind(prefix: Path) -> list[str]:
    """The valgrind command line writing one file per thread at `prefix.<pid>-<thread>`."""
    return [
        "valgrind",
        "--quiet",
        "--tool=callgrind",
        "--separate-threads=yes",
        f"--callgrind-out-file={prefix}.%p",
    ]


def counted(path: Path) -> int:
    """The instructions a callgrind output file counted (its `summary:` or `totals:` line)."""
    with path.open() as lines:
        for line in lines:
            if line.startswith(("summary:", "totals:")):
                return int(line.split(":", 1)[1].split()[0])
    raise ValueError(f"{path} holds no callgrind summary")


def thread_counts(prefix: Path) -> tuple[int, int]:
    """(the main thread's instructions, every other thread's) of the one process whose
    callgrind files start with `prefix`."""
    files = sorted(prefix.parent.glob(f"{prefix.name}.*-*"))
    if not files:
        raise FileNotFoundError(f"callgrind wrote no file at {prefix}.*")
    if len({path.name.rsplit("-", 1)[0] for path in files}) != 1:
        raise ValueError(f"more than one process wrote files at {prefix}.*")
    main = other = 0
    for path in files:
        if path.name.endswith("-01"):
            main += counted(path)
        else:
            other += counted(path)
    return main, other


async def run_cells(
    component: str, workload: str, cells: int, host: Sequence[str] = (), sessions: int = 1
) -> list[list[ContentItem]] | list[list[str]]:
    """Run `cells` cells of `workload` through the component's provider, in `sessions`
    sessions at once (`host`: the command of the host process, for the `host` component; for
    `thin-host`, the command the thin host's is prefixed with); the output of each."""
    source, tools = WORKLOADS[workload]
    if component.startswith("thin-"):
        return await run_thin_cells(source, cells, host, sessions)
    opened: AbstractAsyncContextManager[Any]
    if component == "in-process":
        opened = codemode.open_in_process_provider()
    else:
        # Long bounds: a host under valgrind starts and stops about fifty times slower.
        opened = codemode.open_process_provider(
            host_command=list(host) or None, handshake_timeout=120, shutdown_timeout=120
        )
    async with opened as provider:
        delegate = Delegate()
        runners = []
        for _ in range(sessions):
            session = await provider.create_session()

            async def run(session: codemode.Session = session) -> list[ContentItem]:
                return (await run_cell(session, source, delegate, tools)).content_items

            runners.append(run)
        return await _share_cells(runners, cells)


async def run_thin_cells(
    source: str, cells: int, host: Sequence[str] = (), sessions: int = 1
) -> list[list[str]]:
    """`run_cells` through the thin host (its one tool, `echo`, answered `{}` by the parent)."""
    from benchmarks._thin import open_thin_host

    command = [*host, sys.executable, "-m", "benchmarks._thin_host"] if host else None
    async with open_thin_host(command) as thin:
        return await _share_cells([lambda: thin.run_cell(source)] * sessions, cells)


async def _share_cells(runners: Sequence[Callable[[], Awaitable[T]]], cells: int) -> list[T]:
    """`cells` cells in all, each runner running one after another and all runners at once;
    the outputs in the order the cells finished."""
    outputs: list[T] = []
    left = cells

    async def loop(run: Callable[[], Awaitable[T]]) -> None:
        nonlocal left
        while left > 0:
            left -= 1
            outputs.append(await run())

    async with trio.open_nursery() as nursery:
        for run in runners:
            nursery.start_soon(loop, run)
    return outputs


def count_run(
    component: str,
    workload: str,
    cells: int,
    prefix: Path,
    tracing: str = "off",
    sessions: int = 1,
) -> tuple[int, int]:
    """One run of `cells` cells with the component's process under callgrind; its counts
    (`tracing`: the counted child's tracing mode; the host's own is always off)."""
    if component == "host":
        host = [*callgrind(prefix), sys.executable, "-m", "codemode_host"]
        trio.run(run_cells, component, workload, cells, host, sessions)
    elif component == "thin-host":
        trio.run(run_cells, component, workload, cells, callgrind(prefix), sessions)
    else:
        child = [sys.executable, "-m", "benchmarks.instructions", "--child"]
        child += [component, workload, str(cells), str(sessions)]
        done = subprocess.run(
            [*callgrind(prefix), *child],
            env={**os.environ, TRACING_VARIABLE: tracing},
            timeout=VALGRIND_TIMEOUT_S,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"the counted run failed ({done.returncode}):\n{done.stderr[-2000:]}"
            )
    return thread_counts(prefix)


def per_cell(
    component: str,
    workload: str,
    cells: int,
    directory: Path,
    tracing: str = "off",
    sessions: int = 1,
) -> tuple[float, float]:
    """Instructions one more cell costs the component: (trio thread, other threads). With
    several sessions the shorter run has two cells a session, so that each is as warm."""
    name = f"{component}-{workload}-{tracing}"
    warm = max(WARM, 2 * sessions)
    short = count_run(component, workload, warm, directory / f"{name}-short", tracing, sessions)
    long = count_run(
        component, workload, warm + cells, directory / f"{name}-long", tracing, sessions
    )
    return (long[0] - short[0]) / cells, (long[1] - short[1]) / cells


Row = tuple[str, str, str, list[float], list[float]]
"""component, workload, tracing mode, the trio thread's counts, the other threads'."""


def measure(
    components: Sequence[str],
    workloads: Sequence[str],
    cells: int,
    repeat: int,
    tracing: Sequence[str] = ("off",),
    sessions: int = 1,
) -> list[Row]:
    """For each component, workload and tracing mode, `repeat` measurements of `per_cell`."""
    rows = []
    for component in components:
        for workload in workloads:
            for mode in tracing:
                trio_counts: list[float] = []
                other_counts: list[float] = []
                for _ in range(repeat):
                    with tempfile.TemporaryDirectory(prefix="codemode-callgrind-") as directory:
                        main, other = per_cell(
                            component, workload, cells, Path(directory), mode, sessions
                        )
                    trio_counts.append(main)
                    other_counts.append(other)
                    print(
                        f"  {component} {workload} {mode}: {main:,.0f} / {other:,.0f}", flush=True
                    )
                rows.append((component, workload, mode, trio_counts, other_counts))
    return rows


def render(rows: Sequence[Row]) -> str:
    """The table; with more than one tracing mode, each row's ratio to its `off` row."""
    modes = {row[2] for row in rows}
    lines = [
        f"{'component':<11} {'workload':<8} {'tracing':<8} {'trio thread':>12} {'(min-max)':>21}"
        f" {'other threads':>14}" + (f" {'vs off':>7}" if len(modes) > 1 else "")
    ]
    off = {
        (component, workload): statistics.median(counts)
        for component, workload, mode, counts, _ in rows
        if mode == "off"
    }
    for component, workload, mode, trio_counts, other_counts in rows:
        median = statistics.median(trio_counts)
        spread = f"{min(trio_counts):,.0f}-{max(trio_counts):,.0f}"
        line = (
            f"{component:<11} {workload:<8} {mode:<8} {median:>12,.0f}"
            f" {spread:>21} {statistics.median(other_counts):>14,.0f}"
        )
        base = off.get((component, workload))
        if len(modes) > 1 and base:
            line += f" {median / base:>6.2f}x"
        lines.append(line)
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=400, help="cells of the difference")
    parser.add_argument("--repeat", type=int, default=1, help="measurements of each figure")
    parser.add_argument("--only", default=",".join(COMPONENTS), help="components to count")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="workloads to run")
    parser.add_argument("--tracing", default="off", help="tracing modes: off, noop, memory")
    parser.add_argument("--sessions", type=int, default=1, help="sessions running at once")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    arguments = parser.parse_args(argv)
    if arguments.child:
        component, workload, cells, sessions = arguments.child
        configure_tracing(os.environ.get(TRACING_VARIABLE, "off"))
        trio.run(run_cells, component, workload, int(cells), (), int(sessions))
        return
    components = [name for name in arguments.only.split(",") if name]
    workloads = [name for name in arguments.workloads.split(",") if name]
    tracing = [name for name in arguments.tracing.split(",") if name]
    unknown = (set(components) - set(COMPONENTS)) | (set(workloads) - set(WORKLOADS))
    unknown |= set(tracing) - set(TRACING_MODES)
    if unknown:
        parser.error(f"unknown components or workloads: {sorted(unknown)}")
    if arguments.cells < 1 or arguments.repeat < 1 or arguments.sessions < 1:
        parser.error("--cells, --repeat and --sessions must be at least 1")
    if shutil.which("valgrind") is None:
        parser.error("valgrind is not on the PATH (the counts are callgrind's)")
    at_once = f", {arguments.sessions} sessions at once" if arguments.sessions > 1 else ""
    print(f"instructions per cell ({arguments.cells} cells{at_once}; trio thread / other threads):")
    rows = measure(
        components, workloads, arguments.cells, arguments.repeat, tracing, arguments.sessions
    )
    print(render(rows))


if __name__ == "__main__":
    main()
