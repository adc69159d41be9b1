"""The process provider's timeouts on trio's autojumping mock clock, against in-memory hosts
(`tests/memory_host.py`): the handshake timeout, the close of a host that does not exit, the
provider's shutdown timeout, the heartbeat that gives up a silent host, the retirement of an
idle host of a pool, and the kills that end each. The real client runs (`open_process_provider`, its `HostLink` and sessions); only the
host is a script, so a timeout of seconds takes no real time and each test asserts when it
fired, to the mock clock's tick.

The same behaviours against real subprocesses, where the process matters (a silent process
killed and reaped, a host stuck in its runtime's shutdown), are in `test_host.py` and
`test_fuzz_client.py`, marked slow.
"""

from __future__ import annotations

import pytest
import trio
import trio.testing

import codemode
from codemode import Completed, HostLostError, InputText, Yielded
from codemode._trio._heartbeat import HEARTBEAT_INTERVAL, HEARTBEAT_MISSES
from codemode._wire import CLOSE_TIMEOUT
from codemode.process._provider import IDLE_HOST_TIMEOUT
from tests.delegates import RecordingDelegate
from tests.memory_host import (
    KILLED,
    Script,
    deaf_to_eof,
    exits,
    half_ready,
    memory_hosts,
    serve,
    silent,
    stalls_mid_frame,
    stuck_in_shutdown,
    writes,
)
from tests.sessions import execute, run, texts

BOUND = 600.0
"""Seconds of the mock clock any test here may take (none takes real time)."""
HANDSHAKE = 7.0
SHUTDOWN = 4.0


async def _recovers(provider: codemode.process.ProcessProvider) -> None:
    """A new session works on the next host (a `serve` script, echoing the source)."""
    response = await run(await provider.create_session(), RecordingDelegate(), "recovered")
    assert response == Completed(cell_id="1", content_items=[InputText(text="recovered")])


@pytest.mark.parametrize(
    ("script", "reason", "seconds", "status"),
    [
        pytest.param(silent, "timed out negotiating with the code-mode host", HANDSHAKE, KILLED, id="silent"),
        pytest.param(half_ready, "timed out negotiating with the code-mode host", HANDSHAKE, KILLED, id="half-ready"),
        pytest.param(exits(3), "code-mode host exited during handshake with status 3", 0.0, 3, id="exit"),
        pytest.param(writes(bytes.fromhex("05000000c1c1c1c1c1")), "failed to read code-mode host message", 0.0, KILLED, id="garbage"),
        pytest.param(writes(bytes.fromhex("ffffffff")), "failed to read code-mode host message", 0.0, KILLED, id="too-long"),
    ],
)  # fmt: skip
async def test_a_failed_handshake_kills_the_host_and_the_next_operation_recovers(
    autojump_clock: trio.testing.MockClock,
    monkeypatch: pytest.MonkeyPatch,
    script: Script,
    reason: str,
    seconds: float,
    status: int,
) -> None:
    with trio.fail_after(BOUND):
        async with (
            memory_hosts(monkeypatch, script) as hosts,
            codemode.open_process_provider(handshake_timeout=HANDSHAKE) as provider,
        ):
            start = trio.current_time()
            with pytest.raises(HostLostError) as lost:
                await provider.create_session()
            assert trio.current_time() - start == pytest.approx(seconds)
            assert str(lost.value).startswith(reason), lost.value
            # Any failed handshake kills the host (design.md, host 3), unless it exited first,
            # and reaps it before the error is raised.
            failed = hosts.spawned[0]
            assert failed.exited.is_set()
            assert failed.status == status
            await _recovers(provider)
            assert len(hosts.spawned) == 2


@pytest.mark.parametrize(
    ("script", "seconds", "status"),
    [
        pytest.param(serve, 0.0, 0, id="exits-at-eof"),
        pytest.param(deaf_to_eof, CLOSE_TIMEOUT, KILLED, id="deaf-to-eof"),
    ],
)
async def test_a_closed_host_that_does_not_exit_is_killed_after_the_close_timeout(
    autojump_clock: trio.testing.MockClock,
    monkeypatch: pytest.MonkeyPatch,
    script: Script,
    seconds: float,
    status: int,
) -> None:
    delegate = RecordingDelegate()
    with trio.fail_after(BOUND):
        # Hosts without the heartbeat: a deaf one would otherwise be given up on as silent,
        # perhaps before the close timeout (that one is tested below).
        async with memory_hosts(monkeypatch, script, heartbeat=False) as hosts:
            async with codemode.open_process_provider() as provider:
                session = await provider.create_session()
                assert texts(await run(session, delegate, "hello")) == ["hello"]
            # Once the sessions shut down, the host's stdin closed: it exited at once (or was
            # killed when it had not, CLOSE_TIMEOUT later), before the block was left.
            (host,) = hosts.spawned
            assert host.status == status
            assert host.input_closed_at is not None
            assert host.exited_at is not None
            assert host.exited_at - host.input_closed_at == pytest.approx(seconds)
            assert trio.current_time() == pytest.approx(host.exited_at)


async def test_a_host_stuck_in_shutdown_is_killed_after_the_shutdown_timeout(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    delegate = RecordingDelegate()
    with trio.fail_after(BOUND):
        async with memory_hosts(monkeypatch, stuck_in_shutdown) as hosts:
            async with codemode.open_process_provider(shutdown_timeout=SHUTDOWN) as provider:
                session = await provider.create_session()
                response = await run(session, delegate, "forever", yield_time_ms=0)
                assert response == Yielded(cell_id="1", content_items=[])
                leaving = trio.current_time()
            assert trio.current_time() - leaving == pytest.approx(SHUTDOWN)
            (host,) = hosts.spawned
            assert host.status == KILLED
            assert [type(request).__name__ for _, request in host.held] == ["ShutdownSession"]
    # The kill ended the session's shutdown, and its live cell was closed all the same.
    assert delegate.closed == ["1"]


async def test_a_host_that_stalls_mid_frame_without_a_heartbeat_is_given_up_on_at_exit(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without the heartbeat, a host that stops in the middle of a frame looks like a slow one:
    # the caller's own deadline ends the wait, and the provider's exit kills the host
    # (shutdown_timeout).
    delegate = RecordingDelegate()
    with trio.fail_after(BOUND):
        async with memory_hosts(monkeypatch, stalls_mid_frame, heartbeat=False) as hosts:
            async with codemode.open_process_provider(shutdown_timeout=SHUTDOWN) as provider:
                session = await provider.create_session()
                started = await execute(session, delegate, "text(1)")
                with trio.move_on_after(30) as gave_up:
                    await started.initial_response()
                assert gave_up.cancelled_caught
                leaving = trio.current_time()
            assert trio.current_time() - leaving == pytest.approx(SHUTDOWN)
            assert hosts.spawned[0].status == KILLED
    assert delegate.closed == [started.cell_id]


async def test_a_host_that_stalls_mid_frame_is_lost_after_the_heartbeat_misses(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With the heartbeat, the client pings the silent host every interval and gives it up
    # after `misses` silent ones: what waits on it fails, the host is killed, the session's
    # next operation starts a new one.
    delegate = RecordingDelegate()
    with trio.fail_after(BOUND):
        async with (
            memory_hosts(monkeypatch, stalls_mid_frame) as hosts,
            codemode.open_process_provider() as provider,
        ):
            session = await provider.create_session()
            started = await execute(session, delegate, "text(1)")
            stalled = trio.current_time()
            with pytest.raises(HostLostError) as lost:
                await started.initial_response()
            silent = trio.current_time() - stalled
            assert str(lost.value).startswith(
                f"code-mode host stopped answering: nothing received for {HEARTBEAT_MISSES}"
                f" heartbeat intervals of {HEARTBEAT_INTERVAL:g} s"
            ), lost.value
            # The last bytes came within the interval before the first silent one.
            assert silent >= HEARTBEAT_MISSES * HEARTBEAT_INTERVAL
            assert silent <= (HEARTBEAT_MISSES + 1) * HEARTBEAT_INTERVAL
            # Killed when it was given up on (its task ends at its next step).
            await hosts.spawned[0].exited.wait()
            assert hosts.spawned[0].exited_at == pytest.approx(stalled + silent)
            assert hosts.spawned[0].status == KILLED
            await delegate.until(lambda: delegate.closed == [started.cell_id])
            again = await run(session, RecordingDelegate(), "again")
            assert again == Completed(cell_id="g2:1", content_items=[InputText(text="again")])


async def test_an_idle_host_of_a_pool_is_retired_after_the_idle_timeout(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    with trio.fail_after(BOUND):
        async with (
            memory_hosts(monkeypatch) as hosts,
            codemode.open_process_provider(hosts=2) as provider,
        ):
            first = await provider.create_session()
            second = await provider.create_session()  # the least loaded slot: the second
            assert [host.sessions for host in provider.statistics().hosts] == [1, 1]
            await second.shutdown()
            idle = trio.current_time()
            retired = hosts.spawned[1]
            await retired.exited.wait()
            assert trio.current_time() - idle == pytest.approx(IDLE_HOST_TIMEOUT)
            # Retired gracefully: its stdin closed, it exited by itself.
            assert retired.input_closed.is_set()
            assert retired.status == 0
            statistics = provider.statistics()
            assert statistics.retired == 1
            assert [host.pid for host in statistics.hosts] == [hosts.spawned[0].pid, None]
            # The last live host is never retired: two idle timeouts pass (on the mock clock;
            # a sleep is the only way to see that nothing happens) and it still runs.
            await first.shutdown()
            await trio.sleep(2 * IDLE_HOST_TIMEOUT)
            assert provider.statistics().retired == 1
            assert not hosts.spawned[0].exited.is_set()
