"""Terminate latency (item 4 of issue 10's table), both providers.

A cell says `notify("go")` and then computes without end: a spinning loop (`while (true) {}`)
or a catastrophic regular expression (`/(a+)+$/` on 40 `a`s and a `!`). Once the delegate got
the notification, `Session.terminate` is timed from its call to its return (the cell has ended
and its `cell_closed` ran). Floor: the bare engine's `interrupt()` -> `Finished(INTERRUPTED)`
of the same computation, measured in rounds alternating with the figures. Goal (issue 10):
p50 <= 1 ms, p99 <= 5 ms.

Run: `python -m benchmarks.terminate_bench [--quick]` (from the repository's root).
"""

from __future__ import annotations

import collections
import contextlib
import time

import trio
from codemode_host.engine import open_engine

from benchmarks import _engine_floors
from benchmarks._cells import PROVIDERS, Delegate, request
from benchmarks._measure import MS, Config, Figure, WorkloadError, figure, standalone, stats
from codemode import LiveCell, Session, Terminated

WORKLOADS = {
    "spin": "while (true) {}",
    "regex": '/(a+)+$/.test("a".repeat(40) + "!");',
}
BOUND_S = 30.0
"""The run has failed if it takes this long more than 4 s per terminate (a computation the
interrupt cannot reach)."""


async def _terminate_once(session: Session, delegate: Delegate, body: str) -> float:
    delegate.notified = trio.Event()
    started = await session.execute(request(f'notify("go"); {body}'), delegate)
    started.release()
    await delegate.notified.wait()
    start = time.perf_counter()
    outcome = await session.terminate(started.cell_id)
    elapsed = time.perf_counter() - start
    if not (isinstance(outcome, LiveCell) and isinstance(outcome.response, Terminated)):
        raise WorkloadError(f"terminate did not end the cell: {outcome}")
    return elapsed


async def figures(config: Config) -> list[Figure]:
    rounds = config.n(5, 2)
    each = max(1, config.n(200, 40) // rounds)
    samples: dict[str, list[float]] = collections.defaultdict(list)
    delegate = Delegate()
    with trio.fail_after(BOUND_S + rounds * each * 4):
        async with contextlib.AsyncExitStack() as stack:
            bare = await stack.enter_async_context(open_engine())
            sessions: dict[str, Session] = {}
            for name, opener in PROVIDERS.items():
                provider = await stack.enter_async_context(opener())
                sessions[name] = await provider.create_session()
            for _ in range(rounds):  # floors and figures share the machine's changing load
                for workload, body in WORKLOADS.items():
                    samples[workload] += [
                        await _engine_floors.interrupt(bare, body) for _ in range(each)
                    ]
                    for name, session in sessions.items():
                        samples[f"{workload}/{name}"] += [
                            await _terminate_once(session, delegate, body) for _ in range(each)
                        ]
    return [
        figure(
            f"terminate/{workload}/{name}",
            4,
            f"terminate a {workload} cell, {name}",
            "ms",
            stats(samples[f"{workload}/{name}"], MS),
            stats(samples[workload], MS),
            "bare engine interrupt() -> Finished(INTERRUPTED)",
            goal="p50 <= 1 ms, p99 <= 5 ms",
        )
        for name in PROVIDERS
        for workload in WORKLOADS
    ]


if __name__ == "__main__":
    standalone(figures)
