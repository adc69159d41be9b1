"""The engine against its peers (item 7 of issue 10's table), in the same run.

- `fib(30)` and a JSON-heavy workload (`JSON.stringify` then `JSON.parse` of an object of about
  1 MB, 20 times), each in a bare engine cell (`codemode_host.engine`, `start_cell` ->
  `Finished`), against the `quickjs-ng` wheel from PyPI (`import quickjs`, a fresh `Context`,
  the work timed around `eval`) and `node` when it is on `PATH` (timed inside node with
  `process.hrtime`, after one warm-up run, so its start and JIT warm-up are not counted);
- cell creation, timed on the worker (`Started.setup_ns`): on the critical path (the cell takes
  a prepared runtime, waited for before each start, and installs its globals) and whole
  (`prepared_cells=0`: runtime, context, prelude and globals, the CPU a prepared cell costs in
  all), against the wheel's `Context()` + `eval("1")` + free, from Python, timed after each
  whole creation (interleaved: the VM's speed drifts by tens of percent within a minute).

The wheel is the floor: the same QuickJS-ng version (the nox session pins it to the one the
engine is built from), built by its maintainers. Goal (issue 10): `fib(30)` at least 1.5x
faster than the wheel, that is a ratio <= 0.67.

Run: `python -m benchmarks.engine_bench [--quick]` (from the repository's root).
"""

from __future__ import annotations

import importlib
import json
import shutil
import time
from types import ModuleType

import trio
from codemode_host.engine import Finished, Started, open_engine

from benchmarks._engine_floors import timed_source
from benchmarks._measure import (
    MS,
    US,
    Config,
    Figure,
    Stats,
    WorkloadError,
    figure,
    standalone,
    stats,
)

WHEEL = "quickjs-ng==0.17.0.2"
FIB = "function fib(n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }"
JSON_WORK = """
function makeObject(items) {
  const list = [];
  for (let i = 0; i < items; i++) {
    list.push({ id: i, name: "item " + i, tags: ["alpha", "beta"], score: i / 2, ok: i % 2 === 0 });
  }
  return { list };
}
function jsonWork(items, rounds) {
  const object = makeObject(items);
  let size = 0;
  for (let i = 0; i < rounds; i++) {
    const text = JSON.stringify(object);
    size = text.length;
    JSON.parse(text);
  }
  return size;
}
"""


class Workload:
    def __init__(self, name: str, label: str, definitions: str, call: str) -> None:
        self.name = name
        self.label = label
        self.definitions = definitions
        self.call = call


def workloads(config: Config) -> list[Workload]:
    fib_n, items, rounds = (20, 1000, 2) if config.smoke else (30, 13_000, 20)
    return [
        Workload("fib", f"fib({fib_n})", FIB, f"fib({fib_n})"),
        Workload(
            "json",
            f"JSON stringify+parse x{rounds} of {items:,} items (about {items * 80 // 1000:,} kB)",
            JSON_WORK,
            f"jsonWork({items}, {rounds})",
        ),
    ]


def _wheel() -> ModuleType | None:
    try:
        return importlib.import_module("quickjs")
    except ImportError:
        return None


def _wheel_run(quickjs: ModuleType, work: Workload) -> float:
    context = quickjs.Context()
    context.eval(work.definitions)
    start = time.perf_counter()
    context.eval(work.call)
    return time.perf_counter() - start


def _wheel_context(quickjs: ModuleType) -> float:
    start = time.perf_counter()
    context = quickjs.Context()
    context.eval("1")
    del context
    return time.perf_counter() - start


async def _node_runs(work: Workload, runs: int) -> list[float] | None:
    node = shutil.which("node")
    if node is None:
        return None
    script = f"""{work.definitions}
{work.call};
const times = [];
for (let i = 0; i < {runs}; i++) {{
  const start = process.hrtime.bigint();
  {work.call};
  times.push(Number(process.hrtime.bigint() - start) / 1e9);
}}
console.log(JSON.stringify(times));
"""
    result = await trio.run_process([node, "-e", script], capture_stdout=True)
    timings: list[float] = json.loads(result.stdout)
    return timings


async def _cell_creation(
    runs: int, *, prepared: bool, quickjs: ModuleType | None
) -> tuple[list[float], list[float]]:
    """Cell creations timed on the worker, and (with the wheel) a wheel context timed after each:
    interleaved, so that the VM's drift in speed, which moves both by tens of percent within a
    minute, moves them alike."""
    setups, floors = [], []
    async with open_engine(prepared_cells=None if prepared else 0) as engine:
        for _ in range(runs):
            if prepared and not await engine.wait_prepared():
                raise WorkloadError("the engine did not prepare its runtimes")
            with engine.start_cell("1") as cell:
                events = await cell.next_events()
                while not isinstance(events[-1], Finished):
                    events += await cell.next_events()
            if not isinstance(events[0], Started):
                raise WorkloadError(f"a cell's first event was not Started: {events[0]}")
            setups.append(events[0].setup_ns / 1e9)
            if quickjs is not None:
                floors.append(_wheel_context(quickjs))
    return setups, floors


async def figures(config: Config) -> list[Figure]:
    quickjs = _wheel()
    runs = config.n(5, 2)
    out = []
    for work in workloads(config):
        source = f"{work.definitions}\ntext(String({work.call}));"
        async with open_engine() as engine:
            engine_runs = [await timed_source(engine, source) for _ in range(runs)]
        wheel = stats([_wheel_run(quickjs, work) for _ in range(runs)], MS) if quickjs else None
        node = await _node_runs(work, runs)
        details: dict[str, float] = {}
        value = stats(engine_runs, MS)
        if node is not None:
            node_stats = stats(node, MS)
            details = {"node median": node_stats.median, "ratio to node": _ratio(value, node_stats)}
        out.append(
            figure(
                f"engine/{work.name}",
                7,
                f"{work.label}, bare engine cell",
                "ms",
                value,
                wheel,
                f"{WHEEL} wheel, Context.eval" if quickjs else None,
                goal="<= 0.67x floor (1.5x faster)" if work.name == "fib" else None,
                details=details,
                note=None if quickjs else f"no floor: the {WHEEL} wheel is not installed",
            )
        )
    critical, _ = await _cell_creation(config.n(500, 100), prepared=True, quickjs=None)
    whole, wheel_contexts = await _cell_creation(
        config.n(500, 100), prepared=False, quickjs=quickjs
    )
    floor = stats(wheel_contexts, US) if quickjs else None
    floor_label = f"{WHEEL} wheel, Context() + eval('1') + free, from Python" if quickjs else None
    note = None if quickjs else f"no floor: the {WHEEL} wheel is not installed"
    out.append(
        figure(
            "engine/cell_creation_critical",
            7,
            "cell creation on the critical path (a prepared runtime, on the worker)",
            "us",
            stats(critical, US),
            floor,
            floor_label,
            goal="<= 20 us",
            note=note,
        )
    )
    out.append(
        figure(
            "engine/cell_creation",
            7,
            "cell creation, whole (runtime + context + prelude + globals, on the worker)",
            "us",
            stats(whole, US),
            floor,
            floor_label,
            goal="CPU <= 1.3x floor",
            note=note,
        )
    )
    return out


def _ratio(value: Stats, other: Stats) -> float:
    return value.median / other.median


if __name__ == "__main__":
    standalone(figures)
