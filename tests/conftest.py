"""Fixtures shared by the test suite."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Protocol, TypeVar

import msgspec
import pytest
from codemode_host.engine import Engine, open_engine

import codemode
from codemode import (
    CellInfo,
    CellLimits,
    Completed,
    ExecuteRequest,
    Pending,
    RuntimeResponse,
    Session,
    SessionDelegate,
    SessionUsage,
    StartedCell,
    Terminated,
    WaitOutcome,
    WaitRequest,
)
from tests.delegates import RecordingDelegate
from tests.remote_hosts import SharedHost


class Provider(Protocol):
    async def create_session(
        self, limits: CellLimits | None = None, *, store_load: bool = True
    ) -> Session: ...


@pytest.fixture
async def engine() -> AsyncIterator[Engine]:
    """A real engine (native workers and collector) for one test; no cell may outlive it."""
    async with open_engine() as engine:
        yield engine
        assert engine.live_cells == 0, "a test left a cell open"


PROVIDERS = [
    "in-process",
    pytest.param("process", marks=pytest.mark.slow),
    pytest.param("pool", marks=pytest.mark.slow),
    pytest.param("remote", marks=pytest.mark.slow),
]
"""The rows of the session contract: every provider kind. The rows but in-process start host
processes (`remote` shares one per test session: `shared_host`), so they are slow."""


@pytest.fixture(scope="session")
def shared_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedHost]:
    """One listening host for the session's `remote` rows (started on their first use)."""
    host = SharedHost(tmp_path_factory.mktemp("shared-host"))
    try:
        yield host
    finally:
        host.close()


@pytest.fixture(params=PROVIDERS)
async def provider(
    request: pytest.FixtureRequest, shared_host: SharedHost
) -> AsyncIterator[Provider]:
    """Each provider kind in turn, one of its own per test: in-process, process (one host
    spawned for the test), pool (`hosts=2`: a second session opened while the first is open
    goes to the other host), remote (a connection of the test's own to the session's shared
    listening host). A caller cannot tell them apart but for documented details
    (`host_duration` is None in-process, a float from a host)."""
    kind: str = request.param
    if kind == "in-process":
        async with codemode.open_in_process_provider() as in_process:
            yield _CheckedProvider(in_process, timed=False)
    elif kind == "process":
        async with codemode.open_process_provider() as process:
            yield _CheckedProvider(process, timed=True)
    elif kind == "pool":
        async with codemode.open_process_provider(hosts=2) as pool:
            yield _CheckedProvider(pool, timed=True)
    else:
        async with codemode.open_remote_provider([shared_host.address()]) as remote:
            yield _CheckedProvider(remote, timed=True)
        shared_host.check()


_R = TypeVar("_R", bound=RuntimeResponse | Pending)


def _checked_response(response: _R, timed: bool) -> _R:
    if timed:
        assert isinstance(response.host_duration, float)
        assert response.host_duration >= 0
    else:
        assert response.host_duration is None
    return msgspec.structs.replace(response, host_duration=None)


class _DurationCheckedSession:
    """Checks the one documented difference between providers (`host_duration`: None
    in-process, a float from a host) and hides it, so the same assertions serve both."""

    def __init__(self, session: Session, timed: bool) -> None:
        self._session = session
        self._timed = timed

    @property
    def is_alive(self) -> bool:
        return self._session.is_alive

    async def execute(
        self,
        request: ExecuteRequest,
        delegate: SessionDelegate,
        *,
        observe_initial: bool = True,
        idempotency_key: str | None = None,
    ) -> StartedCell:
        started = await self._session.execute(
            request, delegate, observe_initial=observe_initial, idempotency_key=idempotency_key
        )
        initial = started._initial_response

        async def initial_response() -> RuntimeResponse:
            return _checked_response(await initial(), self._timed)

        # The session's own StartedCell, its initial response checked (as the in-process
        # session wraps its runtime's): a second StartedCell around it would leave the inner
        # one unsettled when the outer one is released, and warn when it is dropped.
        started._initial_response = initial_response
        return started

    def _outcome(self, outcome: WaitOutcome) -> WaitOutcome:
        response = _checked_response(outcome.response, self._timed)
        return msgspec.structs.replace(outcome, response=response)

    async def wait(
        self, request: WaitRequest, *, idempotency_key: str | None = None
    ) -> WaitOutcome:
        return self._outcome(await self._session.wait(request, idempotency_key=idempotency_key))

    async def terminate(self, cell_id: str, *, idempotency_key: str | None = None) -> WaitOutcome:
        return self._outcome(
            await self._session.terminate(cell_id, idempotency_key=idempotency_key)
        )

    async def shutdown(self) -> None:
        await self._session.shutdown()

    async def execute_to_pending(
        self,
        request: ExecuteRequest,
        delegate: SessionDelegate,
        *,
        idempotency_key: str | None = None,
    ) -> Pending | Completed | Terminated:
        response = await self._session.execute_to_pending(
            request, delegate, idempotency_key=idempotency_key
        )
        return _checked_response(response, self._timed)

    async def wait_to_pending(
        self, cell_id: str, *, idempotency_key: str | None = None
    ) -> WaitOutcome:
        return self._outcome(
            await self._session.wait_to_pending(cell_id, idempotency_key=idempotency_key)
        )

    async def preempt(self, cell_id: str) -> None:
        await self._session.preempt(cell_id)

    async def cells(self) -> list[CellInfo]:
        return await self._session.cells()

    async def usage(self) -> SessionUsage:
        return await self._session.usage()


class _CheckedProvider:
    def __init__(self, provider: Provider, timed: bool) -> None:
        self._provider = provider
        self._timed = timed

    async def create_session(
        self, limits: CellLimits | None = None, *, store_load: bool = True
    ) -> Session:
        session = await self._provider.create_session(limits, store_load=store_load)
        return _DurationCheckedSession(session, self._timed)


@pytest.fixture
async def session(provider: Provider) -> Session:
    return await provider.create_session()


@pytest.fixture
def delegate() -> RecordingDelegate:
    return RecordingDelegate()


@pytest.fixture(scope="session")
def everything() -> list[str]:
    """The argv of the npm `server-everything` on stdio, installed on first use (a plain fixture,
    so that a skip for a missing node or npm keeps its reason: tests/mcp_servers.py)."""
    from tests.mcp_servers import everything_command

    return everything_command()
