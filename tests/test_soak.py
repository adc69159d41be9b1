"""A bounded soak of the process provider: 10,000 cells across 50 sessions, each calling a tool.

The host runs with a fixed pool of engine workers (`host_proxy` says why). After a warm-up
(20 cells per session) the host's open fds (`/proc/PID/fd`), threads
(`/proc/PID/task`) and RSS are read; after the soak they are read again. The fds and threads
must be equal, the RSS within 10 % or 32 MiB of the warm-up value, whichever is larger. The
figures are printed (never timed: the cell rate is printed for information).
"""

from __future__ import annotations

import time
from pathlib import Path

import msgspec
import pytest
import trio

import codemode
from codemode import Completed, ExecuteRequest, JsonValue, NestedToolCall, Session
from tests.delegates import RecordingDelegate
from tests.sessions import texts, tool

pytestmark = pytest.mark.slow  # 10,000 cells on a real host.

SESSIONS = 50
CELLS = 10_000
WORKERS = 2
WARM_UP_CELLS = 20
"""Cells per session before the first reading."""
BOUND = 240.0
RSS_SLACK = 0.10
RSS_SLACK_BYTES = 32 << 20

SOURCE = """
const answer = await tools.echo({ n: N });
text(answer.n + 1);
"""
TOOLS = [tool("echo")]


class Figures(msgspec.Struct, frozen=True):
    fds: int
    threads: int
    rss_bytes: int


def read_figures(pid: int) -> Figures:
    proc = Path(f"/proc/{pid}")
    status = (proc / "status").read_text()
    rss_kib = next(
        int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")
    )
    return Figures(
        fds=len(list((proc / "fd").iterdir())),
        threads=len(list((proc / "task").iterdir())),
        rss_bytes=rss_kib * 1024,
    )


async def _echo(call: NestedToolCall) -> JsonValue:
    return call.input


async def _cells(session: Session, delegate: RecordingDelegate, first: int, count: int) -> None:
    for n in range(first, first + count):
        request = ExecuteRequest(
            tool_call_id=f"call-{n}",
            source=SOURCE.replace("N", str(n)),
            enabled_tools=TOOLS,
            yield_time_ms=60_000,
        )
        started = await session.execute(request, delegate)
        response = await started.initial_response()
        assert isinstance(response, Completed), response
        assert texts(response) == [str(n + 1)], response


async def _round(sessions: list[Session], delegates: list[RecordingDelegate], per: int) -> None:
    async with trio.open_nursery() as nursery:
        for index, (session, delegate) in enumerate(zip(sessions, delegates, strict=True)):
            nursery.start_soon(_cells, session, delegate, index * 1_000_000, per)
    # Every cell_closed has arrived: nothing of these cells is still in flight on the host.
    for delegate in delegates:
        await delegate.until(lambda: len(delegate.closed) == len(delegate.invocations))  # noqa: B023


def host_proxy(directory: Path) -> tuple[Path, Path]:
    """A shell script that records its pid, then execs the real host with a fixed pool of
    engine workers: the pool grows (up to --max-workers) when no turn completes for 10 ms
    while work waits, which a loaded machine can cause without any cell computing for long;
    the soak looks for leaks, not for that bounded, documented growth."""
    program = directory / "host-proxy.sh"
    pid_path = directory / "host.pid"
    options = ["--workers", str(WORKERS), "--max-workers", str(WORKERS)]
    host = " ".join(f"'{part}'" for part in [*codemode.default_host_command(), *options])
    program.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$$\" > '{pid_path}'\nexec {host}\n")
    program.chmod(0o700)
    return program, pid_path


async def test_soak_keeps_the_host_steady(tmp_path: Path) -> None:
    proxy, pid_path = host_proxy(tmp_path)
    with trio.fail_after(BOUND):
        async with codemode.open_process_provider([str(proxy)]) as provider:
            sessions: list[Session] = [await provider.create_session() for _ in range(SESSIONS)]
            delegates = [RecordingDelegate(on_tool=_echo) for _ in range(SESSIONS)]
            pid = int(pid_path.read_text())
            await _round(sessions, delegates, WARM_UP_CELLS)
            before = read_figures(pid)
            started = time.perf_counter()
            await _round(sessions, delegates, CELLS // SESSIONS)
            took = time.perf_counter() - started
            after = read_figures(pid)
            assert int(pid_path.read_text()) == pid, "the host was replaced during the soak"
    cells = sum(len(delegate.closed) for delegate in delegates)
    assert cells == SESSIONS * WARM_UP_CELLS + CELLS
    print(
        f"soak: {CELLS} cells with a tool call across {SESSIONS} sessions in {took:.1f} s"
        f" ({CELLS / took:.0f} cells/s); host after warm-up: {before.fds} fds,"
        f" {before.threads} threads, RSS {before.rss_bytes / 2**20:.1f} MiB; after the soak:"
        f" {after.fds} fds, {after.threads} threads, RSS {after.rss_bytes / 2**20:.1f} MiB"
    )
    assert after.fds == before.fds
    assert after.threads == before.threads
    slack = max(before.rss_bytes * RSS_SLACK, RSS_SLACK_BYTES)
    assert abs(after.rss_bytes - before.rss_bytes) <= slack
