"""Host memory (item 6 of issue 10's table): resident memory per idle session, per pending
cell, and after the cells end, read from /proc/<host pid>/status (VmRSS).

One process provider whose host runs with its admission cap raised (`--max-active-cells`) so
that 1,000 cells can wait at once. Steps, each RSS read after the previous step returned:
1. baseline: the host after one session ran 50 cells;
2. 1,000 idle sessions created (per session: the growth over 1,000);
3. 1,000 cells, each `await new Promise(() => {})`, run to their pending frontier
   (`execute_to_pending`) on 10 sessions (per cell: the growth over 1,000);
4. after: every cell terminated and the extra sessions shut down;
5. a second round of step 3 and 4 (its peak beside the first's tells retained from leaked).
The host's engine calls `malloc_trim` by itself once no cell is live (engine rule 10), on a
worker, just after the cells are freed, and once it was idle for `IDLE_RELEASE_SECONDS` it
collects the Python garbage the cells left and trims again: "after" is read once the RSS stopped
falling for `STEADY_SECONDS` (polled every 20 ms, at most 5 s more). Goals (issue 10): <= 250 KB per
pending cell; after within 10 % or 16 MiB of the baseline.

Run: `python -m benchmarks.memory_bench [--quick]` (from the repository's root).
"""

from __future__ import annotations

from collections.abc import Sequence

import trio
from codemode_host.engine import IDLE_RELEASE_SECONDS

import codemode
from benchmarks import _proc
from benchmarks._cells import Delegate, request, run_cell
from benchmarks._measure import Config, Figure, WorkloadError, figure, single, standalone
from codemode import Pending, Session

NEVER = "await new Promise(() => {});"
KIB = 1024
MIB = 1024 * 1024
CELL_SESSIONS = 10
STEADY_SECONDS = 2 * IDLE_RELEASE_SECONDS + 0.5
"""Longer than the host takes to notice it is idle (up to two of its periods)."""


async def _start_pending(session: Session, delegate: Delegate) -> str:
    response = await session.execute_to_pending(request(NEVER), delegate)
    if not isinstance(response, Pending):
        raise WorkloadError(f"the never-settling cell did not pend: {response}")
    return response.cell_id


async def _pending_round(
    sessions: Sequence[Session], delegate: Delegate, count: int, host: int
) -> int:
    """Start `count` never-settling cells over `sessions`, read the host's RSS, terminate
    them; the RSS read."""
    cells: list[tuple[Session, str]] = []
    for i in range(count):
        session = sessions[i % len(sessions)]
        cells.append((session, await _start_pending(session, delegate)))
    peak = _proc.rss_bytes(host)
    async with trio.open_nursery() as nursery:
        for session, cell_id in cells:
            nursery.start_soon(session.terminate, cell_id)
    return peak


async def _settled_rss(host: int) -> int:
    """The host's RSS once it stopped falling for `STEADY_SECONDS` (at most 5 s more): the engine
    trims the freed memory on a worker a moment after the last cell is freed, and again once
    the host was idle for a while and collected its garbage."""
    rss = _proc.rss_bytes(host)
    steady_since = trio.current_time()
    with trio.move_on_after(STEADY_SECONDS + 5):
        while trio.current_time() - steady_since < STEADY_SECONDS:
            await trio.sleep(0.02)
            now = _proc.rss_bytes(host)
            if now < rss:
                rss, steady_since = now, trio.current_time()
    return rss


async def figures(config: Config) -> list[Figure]:
    count = config.n(1000, 300)
    # --max-workers: by default the host sizes its worker ceiling to the active-cell cap, and
    # the engine refuses more than 1,024 workers (the host exited at start with 1,064 active
    # cells). Cells waiting on a promise hold no worker, so a few suffice.
    command = [
        *codemode.default_host_command(),
        "--max-active-cells",
        str(count + 64),
        "--max-requests-in-flight",
        str(count + 64),
        "--max-workers",
        "64",
    ]
    delegate = Delegate()
    async with codemode.open_process_provider(command) as provider:
        first: Session = await provider.create_session()
        for _ in range(50):
            await run_cell(first, 'text("warm")', delegate)
        host = _proc.child_running("codemode_host")
        baseline = _proc.rss_bytes(host)

        idle: list[Session] = [await provider.create_session() for _ in range(count)]
        with_sessions = _proc.rss_bytes(host)

        holders = idle[:CELL_SESSIONS]
        with_cells = await _pending_round(holders, delegate, count, host)
        async with trio.open_nursery() as nursery:
            for session in idle:
                nursery.start_soon(session.shutdown)
        await run_cell(first, 'text("after")', delegate)
        after = await _settled_rss(host)

        # A second round on fresh sessions: if its peak is no higher than the first's, the
        # memory "after" kept is the allocator's, reused, and not a leak.
        again = [await provider.create_session() for _ in range(CELL_SESSIONS)]
        second_peak = await _pending_round(again, delegate, count, host)
        for session in again:
            await session.shutdown()
        second_after = await _settled_rss(host)

    base = single(baseline / MIB)
    grown = after - baseline
    return [
        figure(
            "memory/session",
            6,
            f"host RSS per idle session ({count} sessions)",
            "KiB",
            single((with_sessions - baseline) / count / KIB),
            note="growth of the host's VmRSS over the sessions, divided by their number",
        ),
        figure(
            "memory/pending_cell",
            6,
            f"host RSS per pending cell ({count} cells awaiting a never-settling promise)",
            "KiB",
            single((with_cells - with_sessions) / count / KIB),
            goal="<= 250 KB",
        ),
        figure(
            "memory/after",
            6,
            "host RSS after the cells ended (terminated, sessions shut down)",
            "MiB",
            single(after / MIB),
            base,
            "host RSS before the sessions and cells (after 50 warm-up cells)",
            goal="within 10 % or 16 MiB of the floor",
            details={
                "grown MiB": grown / MIB,
                "grown %": 100 * grown / baseline,
                "first round peak MiB": with_cells / MIB,
                "second round peak MiB": second_peak / MIB,
                "after second round MiB": second_after / MIB,
            },
            note="read once the host's RSS stopped falling (it collects and trims once idle)",
        ),
    ]


if __name__ == "__main__":
    standalone(figures)
