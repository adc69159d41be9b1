"""What every provider is: `codemode.Provider`, and the same `statistics()` record from each
(in-process, process, remote here; Ray's in `tests/test_ray.py`); the session classes that went
away stay importable as deprecated aliases."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio

import codemode
import codemode.process
import codemode.remote
from codemode import HostLoad, Provider, ProviderStatistics, ToolThreadLimits, Yielded
from codemode._wire import WireSession
from tests.delegates import RecordingDelegate
from tests.remote_hosts import listening_host
from tests.sessions import execute

KINDS = [
    "in-process",
    pytest.param("process", marks=pytest.mark.slow),
    pytest.param("remote", marks=pytest.mark.slow),
]
LIMITS = ToolThreadLimits(max_running=3, max_abandoned=5)


@asynccontextmanager
async def open_provider(kind: str) -> AsyncIterator[tuple[Provider, str | None]]:
    """A provider of `kind` (typed as the protocol: mypy checks each satisfies it), and the
    address of its one remote host."""
    provider: Provider
    if kind == "in-process":
        async with codemode.open_in_process_provider(tool_threads=LIMITS) as provider:
            yield provider, None
    elif kind == "process":
        async with codemode.open_process_provider(tool_threads=LIMITS) as provider:
            yield provider, None
    else:
        async with (
            listening_host() as host,
            codemode.open_remote_provider([host.address], tool_threads=LIMITS) as provider,
        ):
            yield provider, host.address


def check_hosts(kind: str, statistics: ProviderStatistics, address: str | None) -> None:
    """The provider's one host (none in-process), holding the provider's cells."""
    if kind == "in-process":
        assert (statistics.hosts, statistics.spawned, statistics.retired) == ((), 0, 0)
        return
    (host,) = statistics.hosts
    assert isinstance(host, HostLoad)
    assert (host.index, host.sessions, host.cells) == (0, statistics.sessions, statistics.cells)
    assert (host.address, statistics.spawned, statistics.retired) == (address, 1, 0)
    if kind == "process":
        assert isinstance(host.pid, int)
    else:
        assert host.pid is None  # not this provider's process


@pytest.mark.parametrize("kind", KINDS)
async def test_every_provider_is_a_provider_with_the_same_statistics(kind: str) -> None:
    delegate = RecordingDelegate()
    with trio.fail_after(30):
        async with open_provider(kind) as (provider, address):
            assert isinstance(provider, Provider)
            sessions = [await provider.create_session() for _ in range(2)]
            if kind != "in-process":  # one session class, whatever placed it
                assert all(type(session) is WireSession for session in sessions)
            started = await execute(sessions[0], delegate, "await new Promise(() => {})",
                                    yield_time_ms=0)  # fmt: skip
            assert isinstance(await started.initial_response(), Yielded)

            statistics = provider.statistics()
            assert isinstance(statistics, ProviderStatistics)
            assert (statistics.sessions, statistics.cells) == (2, 1)
            assert statistics.tool_threads == provider.tool_thread_statistics()
            assert statistics.tool_threads.limits == LIMITS
            check_hosts(kind, statistics, address)

            for session in sessions:
                await session.shutdown()
            assert delegate.closed == ["1"]
            statistics = provider.statistics()
            assert (statistics.sessions, statistics.cells) == (0, 0)
            check_hosts(kind, statistics, address)


@pytest.mark.slow
async def test_the_session_classes_that_went_away_are_deprecated_aliases() -> None:
    with pytest.warns(DeprecationWarning, match=r"^codemode\.process\.ProcessSession is deprec"):
        from codemode.process import ProcessSession
    with pytest.warns(DeprecationWarning, match=r"^codemode\.remote\.RemoteSession is deprec"):
        remote_session = codemode.remote.RemoteSession
    assert ProcessSession is remote_session is WireSession
    with trio.fail_after(20):
        async with codemode.open_process_provider() as provider:
            assert isinstance(await provider.create_session(), ProcessSession)
    for module in (codemode.process, codemode.remote):
        with pytest.raises(AttributeError, match="has no attribute 'Session'"):
            module.Session  # noqa: B018
    assert "ProcessSession" not in codemode.process.__all__
    assert "RemoteSession" not in codemode.remote.__all__


def test_the_process_package_names_the_front_doors_statistics() -> None:
    assert codemode.process.ProviderStatistics is ProviderStatistics
    assert codemode.process.HostLoad is HostLoad
