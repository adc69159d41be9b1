"""Killing the host (SIGKILL) at random points of a workload, in a loop with a fixed seed.

Sessions run cells that print, call tools and yield, observe them with waits, and sometimes
terminate them; a killer waits for a random amount of progress (tool calls, observations,
closed cells: state, never time), then kills whichever host is current. Checked:

- every operation in flight returns or raises `HostLostError` (anything else fails the test);
- every cell a caller learned of gets exactly one `cell_closed` on its delegate, and no cell
  gets two;
- no zombie or orphan host remains once the provider is closed;
- every session recovers: its next cell runs on the next host, under a later generation.
"""

from __future__ import annotations

import os
import random
import signal
from pathlib import Path

import pytest
import trio

import codemode
from codemode import (
    Completed,
    ExecuteRequest,
    HostLostError,
    JsonValue,
    LiveCell,
    MissingCell,
    NestedToolCall,
    Pending,
    Session,
    StaleGenerationError,
    Terminated,
    WaitRequest,
    Yielded,
)
from tests.delegates import RecordingDelegate
from tests.remote_hosts import shared_host_pids
from tests.sessions import texts, tool
from tests.test_host import _dead
from tests.test_seed_stdio import host_proxy

pytestmark = pytest.mark.slow  # Real hosts, killed twenty times.

SEED = 20261201
KILLS = 20
SESSIONS = 4
BOUND = 90.0

SOURCE = """
for (let i = 0; i < 3; i++) {
  text(`step ${i}: ${JSON.stringify(await tools.work({ i }))}`);
  if (i === 1) yield_control();
}
text("done");
"""


class Progress:
    """A counter of things the workload did, awaited by the killer."""

    def __init__(self) -> None:
        self.count = 0
        self._changed = trio.Event()

    def bump(self) -> None:
        self.count += 1
        self._changed.set()
        self._changed = trio.Event()

    async def until(self, target: int) -> None:
        while self.count < target:
            await self._changed.wait()


class Worker:
    """One session's workload, and what it saw."""

    def __init__(self, session: Session, progress: Progress, rng: random.Random) -> None:
        self.session = session
        self.progress = progress
        self.rng = rng
        self.delegate = RecordingDelegate(on_tool=self._work)
        self.started: list[str] = []
        self.lost = 0
        self.finished = 0
        self.stale: list[str] = []
        """Cells observed after their host died (a new operation, not one in flight: it
        fails with StaleGenerationError, design.md, design 3)."""

    async def _work(self, call: NestedToolCall) -> JsonValue:
        self.progress.bump()
        await trio.lowlevel.checkpoint()
        return {"ok": call.runtime_tool_call_id}

    async def run(self, stop: trio.Event) -> None:
        while not stop.is_set():
            try:
                await self._one_cell()
            except HostLostError:
                self.lost += 1  # the only error an operation in flight may raise
            self.progress.bump()

    async def _one_cell(self) -> None:
        request = ExecuteRequest(
            tool_call_id="call", source=SOURCE, enabled_tools=[tool("work")], yield_time_ms=20
        )
        started = await self.session.execute(request, self.delegate)
        self.started.append(started.cell_id)
        response = await started.initial_response()
        while isinstance(response, Yielded):
            self.progress.bump()
            try:
                if self.rng.random() < 0.2:
                    outcome = await self.session.terminate(started.cell_id)
                else:
                    outcome = await self.session.wait(
                        WaitRequest(cell_id=started.cell_id, yield_time_ms=20)
                    )
            except StaleGenerationError:
                self.stale.append(started.cell_id)
                return
            if isinstance(outcome, MissingCell):
                return
            assert isinstance(outcome, LiveCell)
            assert not isinstance(outcome.response, Pending)  # only frontier operations
            response = outcome.response
        assert isinstance(response, Completed | Terminated), response
        if isinstance(response, Completed):
            assert response.error_text is None, response.error_text
        self.finished += 1


def _running_hosts(pids: set[int]) -> list[int]:
    """Of `pids`, those still running as a codemode host (a reused pid does not count)."""
    running = []
    for pid in pids:
        if _dead(pid):
            continue
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"codemode_host" in command:
            running.append(pid)
    return running


def _our_children() -> list[int]:
    """Processes whose parent is this one (none may remain: no zombie, no live host), but
    the listening host the session's remote rows share (tests/remote_hosts.py)."""
    shared = shared_host_pids()
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and int(stat.parent.name) not in shared:
            children.append(int(stat.parent.name))
    return children


async def test_the_host_killed_at_random_points(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    print(f"seed {SEED}")
    proxy, pid_path = host_proxy(tmp_path)
    progress = Progress()
    killed: set[int] = set()
    stop = trio.Event()
    with trio.fail_after(BOUND):
        async with codemode.open_process_provider([str(proxy)]) as provider:
            workers = [
                Worker(await provider.create_session(), progress, random.Random(rng.random()))
                for _ in range(SESSIONS)
            ]
            async with trio.open_nursery() as nursery:
                for worker in workers:
                    nursery.start_soon(worker.run, stop)
                while len(killed) < KILLS:
                    await progress.until(progress.count + rng.randint(1, 80))
                    pid = int(pid_path.read_text())
                    if pid in killed:
                        continue  # no new host yet: wait for more progress
                    os.kill(pid, signal.SIGKILL)
                    killed.add(pid)
                stop.set()
            # Every session recovers: a trivial cell on the next host.
            for worker in workers:
                delegate = RecordingDelegate()
                started = await worker.session.execute(
                    ExecuteRequest(tool_call_id="after", source="text('recovered')"), delegate
                )
                assert started.cell_id.startswith("g"), started.cell_id
                response = await started.initial_response()
                assert texts(response) == ["recovered"]
                await delegate.until(lambda: len(delegate.closed) == 1)  # noqa: B023 - awaited here
        last_host = int(pid_path.read_text())
    for worker in workers:
        closed = worker.delegate.closed
        assert len(closed) == len(set(closed)), closed
        assert set(worker.started) <= set(closed), set(worker.started) - set(closed)
        assert set(worker.stale) <= set(closed)
    assert _running_hosts(killed | {last_host}) == []
    assert _our_children() == []
    print(
        f"host kills: {len(killed)} hosts killed (SIGKILL);"
        f" cells started {sum(len(w.started) for w in workers)},"
        f" finished {sum(w.finished for w in workers)},"
        f" operations that raised HostLostError {sum(w.lost for w in workers)},"
        f" observations of a cell whose host had died {sum(len(w.stale) for w in workers)}"
    )
