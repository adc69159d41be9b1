"""Latency of one cell and of its tool calls, both providers, each beside its floor.

Items of the table (issue 10):
1. execute -> Completed (the initial response) of `text("hi")`; floors: a ping-pong of equally
   sized msgpack frames with a trivial trio+msgspec child (`_floors.py`), and the bare engine
   (`start_cell` -> `Finished`);
2. a nested tool round trip: 1,000 sequential `await tools.echo({})` in one cell, timed per call
   (between the delegate's successive calls); floors: the same ping-pong, and the bare engine's
   tool-call turn;
3. `Promise.all` of 100 tool calls whose delegate sleeps 10 ms; floor: `trio.sleep(0.010)`.

Beside the process provider's figures of 1. and 2., the same cells through the thin host
(`_thin.py`: trio, msgspec and the bare engine in a child, none of codemode's layers), against
the same floors: what a host built on this engine costs at least, so what the process
provider costs beyond it is what codemode's layers add.

Everything is opened at once (the floor child, a bare engine, the thin host, both providers)
and measured in rounds, so that the floors and the figures share the machine's changing load.

Run: `python -m benchmarks.latency_bench [--quick]` (from the repository's root).
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import time
from collections.abc import Awaitable
from typing import Protocol

import msgspec
import trio
from codemode_host.engine import open_engine

from benchmarks import _engine_floors, _floors, _thin
from benchmarks._cells import PROVIDERS, Delegate, request, run_cell, timed_cell
from benchmarks._measure import MS, US, Config, Figure, Stats, figure, standalone, stats
from codemode import Completed, InputText, NestedToolCall, Session, ToolKind, ToolName

TRIVIAL = 'text("hi")'
CALLS = 1000
NESTED = f"for (let i = 0; i < {CALLS}; i++) await tools.echo({{}}); text('done')"
FAN_OUT = 100
PROMISE_ALL = (
    f"await Promise.all(Array.from({{length: {FAN_OUT}}}, () => tools.sleep({{}}))); text('done')"
)
ENVELOPE_BYTES = 32
"""What the wire adds to a message's own encoding (request id, session, tag): an estimate."""


def _size(value: object) -> int:
    return len(msgspec.msgpack.encode(value)) + ENVELOPE_BYTES


EXECUTE_BYTES = _size(request(TRIVIAL))
COMPLETED_BYTES = _size(Completed(cell_id="1", content_items=[InputText(text="hi")]))
CALL_BYTES = _size(
    NestedToolCall(
        cell_id="1",
        runtime_tool_call_id="tool-1",
        tool_name=ToolName.plain("echo"),
        tool_kind=ToolKind.FUNCTION,
        input={},
    )
)
ANSWER_BYTES = _size({})


class _Answerer(Protocol):
    """What answers the tool calls and times their arrivals: a `Delegate` or the thin host."""

    arrivals: list[float]
    record_arrivals: bool


async def _call_gaps(answerer: _Answerer, cell: Awaitable[object]) -> list[float]:
    """Run `cell` (one cell of `NESTED`, its calls answered by `answerer`): the times between
    successive calls."""
    answerer.arrivals.clear()
    answerer.record_arrivals = True
    try:
        await cell
    finally:
        answerer.record_arrivals = False
    return [b - a for a, b in itertools.pairwise(answerer.arrivals)]


async def _thin_cell(thin: _thin.ThinHost) -> float:
    start = time.perf_counter()
    await thin.run_cell(TRIVIAL)
    return time.perf_counter() - start


async def _sleeps(runs: int) -> list[float]:
    timings = []
    for _ in range(runs):
        start = time.perf_counter()
        await trio.sleep(0.010)
        timings.append(time.perf_counter() - start)
    return timings


async def _measure(config: Config) -> dict[str, list[float]]:
    """Every sample, by name. The floors and the figures are measured in rounds, one after the
    other within each round, so that a machine whose load changes during the run weighs on
    all of them alike."""
    rounds = config.n(5, 2)
    each = max(1, config.n(2000, 300) // rounds)
    fan_outs = max(1, config.n(30, 8) // rounds)
    samples: dict[str, list[float]] = collections.defaultdict(list)
    delegate = Delegate()
    async with contextlib.AsyncExitStack() as stack:
        child = await stack.enter_async_context(_floors.open_floor_child())
        bare = await stack.enter_async_context(open_engine())
        thin = await stack.enter_async_context(_thin.open_thin_host())
        sessions: dict[str, Session] = {}
        for name, opener in PROVIDERS.items():
            provider = await stack.enter_async_context(opener())
            sessions[name] = await provider.create_session()
        for _ in range(config.n(200, 50)):  # warm up: threads, allocator, caches
            await _floors.ping_pong(child, 1, EXECUTE_BYTES, COMPLETED_BYTES)
            await _engine_floors.round_trip(bare)
            await thin.run_cell(TRIVIAL)
            for session in sessions.values():
                await run_cell(session, TRIVIAL, delegate)
        for _ in range(rounds):
            pipe = _floors.ping_pong
            samples["pipe"] += await pipe(child, each, EXECUTE_BYTES, COMPLETED_BYTES)
            samples["pipe call"] += await pipe(child, each, ANSWER_BYTES, CALL_BYTES)
            samples["engine"] += [await _engine_floors.round_trip(bare) for _ in range(each)]
            samples["engine call"] += await _engine_floors.tool_turns(bare, each)
            samples["sleep"] += await _sleeps(fan_outs)
            samples["execute/thin-host"] += [await _thin_cell(thin) for _ in range(each)]
            samples["tool/thin-host"] += await _call_gaps(thin, thin.run_cell(NESTED))
            for name, session in sessions.items():
                samples[f"execute/{name}"] += [
                    await timed_cell(session, TRIVIAL, delegate) for _ in range(each)
                ]
                nested = run_cell(session, NESTED, delegate, ["echo"])
                samples[f"tool/{name}"] += await _call_gaps(delegate, nested)
                samples[f"promise_all/{name}"] += [
                    await timed_cell(session, PROMISE_ALL, delegate, ["sleep"])
                    for _ in range(fan_outs)
                ]
    return samples


async def figures(config: Config) -> list[Figure]:
    samples = await _measure(config)
    sleep_floor = stats(samples["sleep"], MS)
    pipe = stats(samples["pipe"], MS)
    engine = stats(samples["engine"], MS)
    pipe_call = stats(samples["pipe call"], US)
    engine_call = stats(samples["engine call"], US)
    pipe_label = (
        f"trio ping-pong with a trio+msgspec child, {EXECUTE_BYTES} B out / {COMPLETED_BYTES} B"
        " back"
    )
    call_label = (
        f"trio ping-pong with a trio+msgspec child, {ANSWER_BYTES} B out / {CALL_BYTES} B back"
    )
    thin = stats(samples["execute/thin-host"], MS)
    thin_call = stats(samples["tool/thin-host"], US)
    out: list[Figure] = []
    for name in PROVIDERS:
        value = stats(samples[f"execute/{name}"], MS)
        process = name == "process"
        out.append(
            figure(
                f"execute/{name}",
                1,
                f'execute -> Completed of text("hi"), {name}',
                "ms",
                value,
                pipe if process else engine,
                pipe_label if process else 'bare engine, start_cell -> Finished of text("hi")',
                goal="<= 3x floor" if process else None,
                details=_second_floor(value, engine if process else pipe, process)
                | (_thin_details(value, thin) if process else {}),
            )
        )
    out.append(
        figure(
            "execute/thin-host",
            1,
            f'execute -> done of text("hi"), {_thin.LABEL}',
            "ms",
            thin,
            pipe,
            pipe_label,
            details=_second_floor(thin, engine, True),
        )
    )
    for name in PROVIDERS:
        value = stats(samples[f"tool/{name}"], US)
        process = name == "process"
        out.append(
            figure(
                f"tool/{name}",
                2,
                f"nested tool round trip (1,000 sequential echo), per call, {name}",
                "us",
                value,
                pipe_call if process else engine_call,
                call_label if process else "bare engine tool-call turn (settle -> next call)",
                goal="<= 2x floor" if process else None,
                details=_second_floor(value, engine_call if process else pipe_call, process)
                | (_thin_details(value, thin_call) if process else {}),
            )
        )
    out.append(
        figure(
            "tool/thin-host",
            2,
            f"nested tool round trip (1,000 sequential echo), per call, {_thin.LABEL}",
            "us",
            thin_call,
            pipe_call,
            call_label,
            details=_second_floor(thin_call, engine_call, True),
        )
    )
    for name in PROVIDERS:
        out.append(
            figure(
                f"promise_all/{name}",
                3,
                f"Promise.all of {FAN_OUT} tool calls sleeping 10 ms, {name}",
                "ms",
                stats(samples[f"promise_all/{name}"], MS),
                sleep_floor,
                "trio.sleep(0.010)",
            )
        )
    return out


def _second_floor(value: Stats, other: Stats, process: bool) -> dict[str, float]:
    name = "bare engine" if process else "ping-pong"
    return {f"{name} median": other.median, f"ratio to {name}": value.median / other.median}


def _thin_details(value: Stats, thin: Stats) -> dict[str, float]:
    return {"thin host median": thin.median, "ratio to thin host": value.median / thin.median}


if __name__ == "__main__":
    standalone(figures)
