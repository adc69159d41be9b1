"""The benchmark table of issue 10: every figure beside its floor, measured in one run, printed
as one table and written as JSON (`benchmarks/results/latest.json` unless `--json PATH`).

Scripts, in the table's order (each also runs on its own: `python -m benchmarks.<name>`):
- latency_bench: 1 execute -> Completed, 2 nested tool round trip, 3 `Promise.all` fan-out;
- terminate_bench: 4 terminate latency;
- throughput_bench: 5 cells/s with 1, 8, 64 sessions, CPU per cell per component;
- memory_bench: 6 host RSS per idle session, per pending cell, after;
- engine_bench: 7 `fib(30)`, JSON, cell creation against the quickjs-ng wheel and node;
- startup_bench: 8 cold start;
- payload_bench: 9 a 16 MiB string, and 100,000 objects, returned by a tool.

Nothing is asserted: goals are printed beside their figures. `--quick` cuts the repetitions (about
a minute); the full run takes a few minutes on a 2-core machine. `docs/benchmarks.md` says how
to read the table; `python -m benchmarks.chart` draws the JSON.

Run: `python -m benchmarks.table [--quick] [--json PATH] [--only latency,engine,...]` (from the
repository's root), or `nox -s bench`.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import trio

from benchmarks import (
    engine_bench,
    latency_bench,
    memory_bench,
    payload_bench,
    startup_bench,
    terminate_bench,
    throughput_bench,
)
from benchmarks._measure import DEFAULT_JSON, Config, Figure, Table, new_table, render, write_json

SCRIPTS: dict[str, Callable[[Config], Awaitable[list[Figure]]]] = {
    "latency": latency_bench.figures,
    "terminate": terminate_bench.figures,
    "throughput": throughput_bench.figures,
    "memory": memory_bench.figures,
    "engine": engine_bench.figures,
    "startup": startup_bench.figures,
    "payload": payload_bench.figures,
}


async def measure(config: Config, only: Sequence[str] = ()) -> Table:
    """Run the scripts named in `only` (default: all), in the table's order."""
    unknown = set(only) - set(SCRIPTS)
    if unknown:
        raise ValueError(f"no benchmark script {sorted(unknown)}; known: {sorted(SCRIPTS)}")
    started, wall = time.time(), time.perf_counter()
    figures: list[Figure] = []
    for name, script in SCRIPTS.items():
        if not only or name in only:
            figures += await script(config)
    figures.sort(key=lambda each: each.item)  # stable: each script's own order within an item
    return new_table(config, figures, started, wall)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (about 1 min)")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help="where to write the JSON")
    parser.add_argument(
        "--only", default="", help=f"comma-separated scripts to run (of {', '.join(SCRIPTS)})"
    )
    arguments = parser.parse_args(argv)
    config = Config(mode="quick" if arguments.quick else "full")
    only = [name for name in arguments.only.split(",") if name]
    table = trio.run(measure, config, only)
    print(render(table.figures))
    machine = table.machine
    print(
        f"\n{machine.cpus} CPUs ({machine.cpu_model}), Python {machine.python}, load average"
        f" {' '.join(f'{x:.2f}' for x in machine.load_average)}; {table.mode} run,"
        f" {table.seconds:.0f} s"
    )
    write_json(table, arguments.json)
    print(f"written: {arguments.json}")


if __name__ == "__main__":
    main()
