"""A pool of hosts behind one process provider (`open_process_provider(hosts=N)`).

Real host processes and the real engine. Tests synchronise on state: the provider's
`statistics()`, what the delegates recorded, a host process's exit (a pidfd), never on sleeps.
`hosts=1` (the default) is covered by the rest of the suite, the seed's tests first.
"""

from __future__ import annotations

import os
import signal

import pytest
import trio
import trio.testing

import codemode
from codemode import (
    AdmissionError,
    Completed,
    InvalidRequestError,
    LiveCell,
    Session,
    StaleGenerationError,
    WaitRequest,
    Yielded,
)
from codemode.process import ProcessProvider
from tests.delegates import RecordingDelegate
from tests.helpers import wait_exited
from tests.sessions import execute, run, texts, tool
from tests.test_host import _dead

HELD = 'text(JSON.stringify(await tools.work({}))); text("done");'


def spread(provider: ProcessProvider) -> list[int]:
    return [host.sessions for host in provider.statistics().hosts]


def pids(provider: ProcessProvider) -> list[int | None]:
    return [host.pid for host in provider.statistics().hosts]


async def closed(delegate: RecordingDelegate, cells: list[str]) -> None:
    """Until the delegate's `cell_closed` ran for exactly `cells`."""
    await delegate.until(lambda: delegate.closed == cells)


async def hold_a_cell(session: Session, delegate: RecordingDelegate) -> str:
    """Start a cell that waits in a held tool call; returns its id once the tool was called."""
    delegate.hold_tools = True
    calls = len(delegate.invocations)
    response = await run(session, delegate, HELD, yield_time_ms=1, tools=[tool("work")])
    assert isinstance(response, Yielded)
    await delegate.until(lambda: len(delegate.invocations) > calls)
    return response.cell_id


@pytest.mark.parametrize("hosts", [0, -1, 1.5, True])
async def test_a_pool_needs_at_least_one_host(hosts: int) -> None:
    with pytest.raises(InvalidRequestError, match="hosts must be at least 1"):
        async with codemode.open_process_provider(hosts=hosts):
            pass  # pragma: no cover


async def test_a_negative_idle_host_timeout_is_refused() -> None:
    with pytest.raises(InvalidRequestError, match="idle_host_timeout must be at least 0"):
        async with codemode.open_process_provider(hosts=2, idle_host_timeout=-1.0):
            pass  # pragma: no cover


@pytest.mark.slow
async def test_sessions_spread_evenly_over_lazily_spawned_hosts() -> None:
    with trio.fail_after(60):
        async with codemode.open_process_provider(hosts=4) as provider:
            assert pids(provider) == [None] * 4  # nothing is spawned before it is needed
            sessions: list[Session] = []
            async with trio.open_nursery() as nursery:  # created at once: placed at once

                async def create() -> None:
                    sessions.append(await provider.create_session())

                for _ in range(8):
                    nursery.start_soon(create)
            assert spread(provider) == [2, 2, 2, 2]
            statistics = provider.statistics()
            assert statistics.spawned == 4
            assert len({pid for pid in pids(provider) if pid is not None}) == 4
            delegate = RecordingDelegate()
            for session in sessions:
                response = await run(session, delegate, 'text("hi");')
                assert isinstance(response, Completed)
                assert response.cell_id == "1"  # each session's first cell, first generation
                assert texts(response) == ["hi"]
            await delegate.until(lambda: len(delegate.closed) == 8)
            assert [host.cells for host in provider.statistics().hosts] == [0, 0, 0, 0]


@pytest.mark.slow
async def test_placement_goes_by_active_cells_before_sessions() -> None:
    with trio.fail_after(60):
        async with codemode.open_process_provider(hosts=2) as provider:
            busy = await provider.create_session()
            await provider.create_session()
            assert spread(provider) == [1, 1]
            delegate = RecordingDelegate()
            cell = await hold_a_cell(busy, delegate)
            assert [host.cells for host in provider.statistics().hosts] == [1, 0]
            # Host 0 runs a cell: new sessions go to host 1, whatever its session count.
            await provider.create_session()
            await provider.create_session()
            assert spread(provider) == [1, 3]
            # Once the cell ended, the session count decides again.
            outcome = await busy.terminate(cell)
            assert isinstance(outcome, LiveCell)
            assert [host.cells for host in provider.statistics().hosts] == [0, 0]
            await provider.create_session()
            assert spread(provider) == [2, 3]


@pytest.mark.slow
async def test_a_killed_host_affects_only_its_own_sessions() -> None:
    with trio.fail_after(60):
        async with codemode.open_process_provider(hosts=2) as provider:
            sessions = [await provider.create_session() for _ in range(4)]
            assert spread(provider) == [2, 2]  # sessions 0 and 2 on host 0, 1 and 3 on host 1
            delegates = [RecordingDelegate() for _ in sessions]
            cells = [
                await hold_a_cell(session, delegate)
                for session, delegate in zip(sessions, delegates, strict=True)
            ]
            assert cells == ["1", "1", "1", "1"]
            victim, survivor = pids(provider)
            assert victim is not None
            assert survivor is not None

            os.kill(victim, signal.SIGKILL)
            for index in (0, 2):  # the victim's cells close, their tool calls are cancelled
                delegate = delegates[index]
                await closed(delegate, ["1"])
                assert len(delegate.cancelled_tools) == 1
            assert pids(provider) == [None, survivor]

            # The other host's cells run on: their tools answer, they complete.
            for index in (1, 3):
                delegates[index].release.set()
                outcome = await sessions[index].wait(WaitRequest(cell_id="1", yield_time_ms=60_000))
                assert isinstance(outcome, LiveCell)
                assert isinstance(outcome.response, Completed)
                assert texts(outcome) == ['{"value":"output"}', "done"]
                delegate = delegates[index]
                await closed(delegate, ["1"])
                assert delegate.cancelled_tools == []

            # The victim's sessions re-open under the next generation (on host 0, respawned:
            # it is the less loaded), silently, as the seed prescribes for one host.
            for index in (0, 2):
                session, delegate = sessions[index], delegates[index]
                with pytest.raises(StaleGenerationError):
                    await session.wait(WaitRequest(cell_id="1", yield_time_ms=1))
                response = await run(session, delegate, 'text("again");')
                assert isinstance(response, Completed)
                assert response.cell_id == "g2:1"
                assert texts(response) == ["again"]
                # A cell counts on its host until its closing frame, right after its result.
                await closed(delegate, ["1", "g2:1"])
            replacement, still = pids(provider)
            assert still == survivor
            assert replacement not in (None, victim)
            assert spread(provider) == [2, 2]
            assert provider.statistics().spawned == 3

            # The survivor's sessions never changed generation; cells() lists public ids.
            response = await run(sessions[1], delegates[1], 'text("same");')
            assert response.cell_id == "2"
            delegates[0].hold_tools = True
            delegates[0].release = trio.Event()
            cell = await hold_a_cell(sessions[0], delegates[0])
            assert cell == "g2:2"
            assert [info.cell_id for info in await sessions[0].cells()] == ["g2:2"]
            assert await sessions[2].cells() == []
            delegates[0].release.set()


@pytest.mark.slow
async def test_an_idle_empty_host_is_retired_but_the_last_one_is_kept() -> None:
    with trio.fail_after(60):
        async with codemode.open_process_provider(hosts=2, idle_host_timeout=0.0) as provider:
            first = await provider.create_session()
            second = await provider.create_session()
            kept, retired = pids(provider)
            assert kept is not None
            assert retired is not None

            await second.shutdown()
            await wait_exited(retired)
            assert pids(provider) == [kept, None]
            assert provider.statistics().retired == 1

            # The last live host stays warm, idle or not.
            await first.shutdown()
            await trio.testing.wait_all_tasks_blocked()
            assert pids(provider) == [kept, None]
            assert provider.statistics().retired == 1
            assert spread(provider) == [0, 0]

            # New sessions take the warm host first, then respawn the retired slot.
            third = await provider.create_session()
            fourth = await provider.create_session()
            assert spread(provider) == [1, 1]
            assert pids(provider)[0] == kept
            assert pids(provider)[1] not in (None, retired)
            response = await run(fourth, RecordingDelegate(), 'text("back");')
            assert texts(response) == ["back"]
            await third.shutdown()


@pytest.mark.slow
async def test_a_host_with_a_session_is_not_retired() -> None:
    with trio.fail_after(60):
        async with codemode.open_process_provider(hosts=3, idle_host_timeout=0.0) as provider:
            sessions = [await provider.create_session() for _ in range(3)]
            await trio.testing.wait_all_tasks_blocked()
            assert None not in pids(provider)
            assert provider.statistics().retired == 0
            await sessions[1].shutdown()
            await trio.testing.wait_all_tasks_blocked()
            assert pids(provider)[1] is None
            assert None not in (pids(provider)[0], pids(provider)[2])


@pytest.mark.slow
@pytest.mark.parametrize("ending", ["normal", "cancelled"])
async def test_leaving_a_pool_leaves_no_process(ending: str) -> None:
    seen: list[int] = []
    with trio.fail_after(60):
        with trio.CancelScope() as scope:
            async with codemode.open_process_provider(hosts=3) as provider:
                delegate = RecordingDelegate()
                for _ in range(6):
                    session = await provider.create_session()
                    await run(session, delegate, "await new Promise(() => {});", yield_time_ms=0)
                assert spread(provider) == [2, 2, 2]
                seen = [pid for pid in pids(provider) if pid is not None]
                if ending == "cancelled":
                    scope.cancel()
                    await trio.sleep_forever()
        assert len(seen) == 3
        assert all(_dead(pid) for pid in seen)
        assert len(delegate.closed) == 6


@pytest.mark.slow
async def test_admission_limits_hold_per_host() -> None:
    command = [*codemode.default_host_command(), "--max-active-cells", "1"]
    with trio.fail_after(60):
        async with codemode.open_process_provider(command, hosts=2) as provider:
            first = await provider.create_session()
            second = await provider.create_session()
            third = await provider.create_session()
            assert spread(provider) == [2, 1]
            delegate = RecordingDelegate()
            await hold_a_cell(first, delegate)
            # Host 0's one active cell is taken, for every session on it...
            with pytest.raises(AdmissionError, match="too many active cells"):
                await execute(third, delegate, 'text("no");')
            # ...and host 1 has its own.
            await hold_a_cell(second, RecordingDelegate())
            delegate.release.set()
