"""What every benchmark shares: how many repetitions, how samples become a figure, and how the
figures become one table (printed) and one JSON document (written).

Rules:
1. A figure is measured beside its floor in the same run, and carries both, with their ratio.
2. A goal is printed beside its figure, never asserted: speed is reported, the test suite only
   checks that the instrument runs and writes its schema.
3. Latencies are kept in seconds inside, shown in milliseconds or microseconds; a figure's
   `unit` says which scale its numbers are in the JSON.
"""

from __future__ import annotations

import datetime
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import msgspec

SCHEMA = 1


class WorkloadError(Exception):
    """A workload did not do what its benchmark needs (a cell failed, was not interrupted, ...):
    the figure would measure something else, so the run stops."""


DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "latest.json"


class Config(msgspec.Struct, frozen=True, kw_only=True):
    """How hard to measure.

    Parameters:
        mode: "full" (the table of record, a few minutes), "quick" (about a minute) or
            "smoke" (seconds: the test suite's, only to check the instrument runs).
    """

    mode: str = "full"

    def n(self, full: int, quick: int) -> int:
        """Repetitions: `full` or `quick` by mode; a smoke run does 2 or 3 at most."""
        if self.mode == "full":
            return full
        if self.mode == "quick":
            return quick
        return max(1, min(quick, 3))

    @property
    def smoke(self) -> bool:
        return self.mode == "smoke"


class Stats(msgspec.Struct, frozen=True, kw_only=True):
    """Samples summarised, in the figure's unit.

    Parameters:
        median: the median sample.
        p99: the 99th percentile (nearest rank); with fewer than 100 samples, the largest.
        n: how many samples.
    """

    median: float
    p99: float
    n: int


def stats(samples: Sequence[float], scale: float = 1.0) -> Stats:
    """The median and p99 of `samples`, each multiplied by `scale` (1e3: seconds to ms)."""
    if not samples:
        raise ValueError("no samples")
    ordered = sorted(samples)
    rank = max(0, math.ceil(0.99 * len(ordered)) - 1)
    return Stats(
        median=statistics.median(ordered) * scale, p99=ordered[rank] * scale, n=len(ordered)
    )


def single(value: float) -> Stats:
    """One measurement (a rate over a whole run, a memory figure)."""
    return Stats(median=value, p99=value, n=1)


class Figure(msgspec.Struct, frozen=True, kw_only=True):
    """One row of the table.

    Parameters:
        key: a stable name (`execute/process`), for the chart and for comparing runs.
        item: the number of the issue's list this row answers (1-9).
        label: what was measured, for the reader.
        unit: the scale of `value` and `floor` ("ms", "us", "cells/s", "KiB", "MiB").
        value: the figure.
        floor: what it is measured against, in the same run and unit (None: no floor).
        floor_label: what the floor is.
        ratio: `value.median / floor.median`.
        higher_is_better: True for rates (then a ratio above 1 is the good side).
        goal: the issue's goal for this figure, as text ("<= 3x floor"), or None.
        details: further numbers of the row (CPU per component, counts, notes' numbers).
        note: anything the reader needs to weigh the figure.
    """

    key: str
    item: int
    label: str
    unit: str
    value: Stats
    floor: Stats | None = None
    floor_label: str | None = None
    ratio: float | None = None
    higher_is_better: bool = False
    goal: str | None = None
    details: dict[str, float] = {}
    note: str | None = None


def figure(
    key: str,
    item: int,
    label: str,
    unit: str,
    value: Stats,
    floor: Stats | None = None,
    floor_label: str | None = None,
    *,
    higher_is_better: bool = False,
    goal: str | None = None,
    details: dict[str, float] | None = None,
    note: str | None = None,
) -> Figure:
    """A figure with its ratio to the floor computed."""
    ratio = None
    if floor is not None and floor.median > 0:
        ratio = value.median / floor.median
    return Figure(
        key=key,
        item=item,
        label=label,
        unit=unit,
        value=value,
        floor=floor,
        floor_label=floor_label,
        ratio=ratio,
        higher_is_better=higher_is_better,
        goal=goal,
        details=details or {},
        note=note,
    )


class Machine(msgspec.Struct, frozen=True, kw_only=True):
    """Where the table was measured."""

    cpus: int
    cpu_model: str
    python: str
    platform: str
    load_average: tuple[float, float, float]


class Table(msgspec.Struct, frozen=True, kw_only=True):
    """The JSON document: `schema` changes when a field changes meaning."""

    schema: int
    started: str
    seconds: float
    mode: str
    machine: Machine
    figures: list[Figure]


def machine() -> Machine:
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return Machine(
        cpus=os.cpu_count() or 1,
        cpu_model=model,
        python=sys.version.split()[0],
        platform=platform.platform(),
        load_average=os.getloadavg(),
    )


def _number(value: float) -> str:
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.3f}"


def _stat(stat: Stats | None) -> tuple[str, str]:
    if stat is None:
        return "", ""
    return _number(stat.median), "" if stat.n == 1 else _number(stat.p99)


def render(figures: Sequence[Figure]) -> str:
    """The table as text: one line per figure, its floor, the ratio and the goal; details
    below their figure."""
    header = ("#", "figure", "unit", "median", "p99", "floor", "floor p99", "ratio", "goal")
    rows: list[tuple[str, ...]] = []
    for each in figures:
        value, value_p99 = _stat(each.value)
        floor, floor_p99 = _stat(each.floor)
        ratio = "" if each.ratio is None else f"{each.ratio:.2f}x"
        rows.append(
            (
                str(each.item),
                each.label,
                each.unit,
                value,
                value_p99,
                floor,
                floor_p99,
                ratio,
                each.goal or "",
            )
        )
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    left = {0, 1, 2, 8}

    def line(row: tuple[str, ...]) -> str:
        cells = [
            cell.ljust(width) if i in left else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        return "  ".join(cells).rstrip()

    out = [line(header), "  ".join("-" * width for width in widths)]
    for each, row in zip(figures, rows, strict=True):
        out.append(line(row))
        if each.floor_label:
            out.append(f"{'':{widths[0]}}    floor: {each.floor_label}")
        if each.details:
            shown = ", ".join(f"{k} {_number(v)}" for k, v in each.details.items())
            out.append(f"{'':{widths[0]}}    {shown}")
        if each.note:
            out.append(f"{'':{widths[0]}}    note: {each.note}")
    return "\n".join(out)


def write_json(table: Table, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(msgspec.json.format(msgspec.json.encode(table), indent=2) + b"\n")


def read_json(path: Path) -> Table:
    return msgspec.json.decode(path.read_bytes(), type=Table)


def new_table(config: Config, figures: list[Figure], started: float, wall: float) -> Table:
    stamp = datetime.datetime.fromtimestamp(started, datetime.UTC).isoformat(timespec="seconds")
    return Table(
        schema=SCHEMA,
        started=stamp,
        seconds=round(time.perf_counter() - wall, 1),
        mode=config.mode,
        machine=machine(),
        figures=figures,
    )


MS = 1e3
US = 1e6


def standalone(figures: Callable[[Config], Awaitable[list[Figure]]]) -> None:
    """Run one benchmark script on its own: `--quick` or the full count; print its rows."""
    import argparse

    import trio

    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    arguments = parser.parse_args()
    config = Config(mode="quick" if arguments.quick else "full")
    print(render(trio.run(figures, config)))
