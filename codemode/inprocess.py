"""The in-process provider: sessions served by the runtime inside the caller's trio loop.

The same API as the process provider, without a host process: the engine's worker threads
run the JavaScript, and cells, tool calls and notifications are tasks of the provider's
nursery. Documented differences (`docs/python-api.md`): `host_duration` is always None, and a
crash of the engine takes the application with it (the process provider isolates it).

Rules:
1. A session's shutdown runs as a task of the provider: cancelling the caller of `shutdown()`
   does not stop it, and every later `shutdown()` waits for the same end.
2. The provider forgets a session once it is shut down: nothing is retained per closed session.
3. After the provider's block, every operation raises `ProviderClosedError`.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio
from codemode_host.engine import Engine, open_engine
from codemode_host.runtime import RuntimeSession

from ._api import CellLimits, ExecuteRequest, SessionDelegate, StartedCell, WaitOutcome, WaitRequest
from ._trio import RunOnce, open_service_nursery
from .errors import ProviderClosedError, SessionShuttingDownError, check_platform

SHUTDOWN_TIMEOUT = 5.0
"""Seconds the provider's exit waits for its sessions to shut down before cancelling them."""

logger = logging.getLogger("codemode.inprocess")


class InProcessSession:
    """A session whose cells run in this process (implements `codemode.Session`).

    Made by `InProcessProvider.create_session`.
    """

    def __init__(self, provider: InProcessProvider, runtime: RuntimeSession) -> None:
        self._provider = provider
        self._runtime = runtime
        self._shutdown = RunOnce()

    @property
    def is_alive(self) -> bool:
        """False once shutdown began (or the provider closed)."""
        return self._runtime.is_alive and not self._provider.closed

    def _check(self) -> None:
        if self._provider.closed:
            raise ProviderClosedError()
        if self._shutdown.started:
            raise SessionShuttingDownError()

    async def execute(self, request: ExecuteRequest, delegate: SessionDelegate) -> StartedCell:
        """Admit a cell and start it; returns before its first response.

        Raises:
            SessionShuttingDownError: shutdown has begun.
            ProviderClosedError: the provider was closed.
        """
        self._check()
        return await self._runtime.execute(request, delegate)

    async def wait(self, request: WaitRequest) -> WaitOutcome:
        """Observe a cell: new output, its completion, or its termination.

        Raises:
            ObserverBusyError: another observation of the cell is in progress.
            SessionShuttingDownError: shutdown has begun.
            ProviderClosedError: the provider was closed.
        """
        self._check()
        return await self._runtime.wait(request)

    async def terminate(self, cell_id: str) -> WaitOutcome:
        """Stop a cell and return its undelivered output (or its buffered completion).

        Raises:
            AlreadyTerminatingError: a termination of that cell is in progress.
            SessionShuttingDownError: shutdown has begun.
            ProviderClosedError: the provider was closed.
        """
        self._check()
        return await self._runtime.terminate(cell_id)

    async def shutdown(self) -> None:
        """Terminate every cell and return once each has closed (rule 1)."""
        await self._shutdown.run(self._provider._nursery, self._shut_down)

    async def _shut_down(self) -> None:
        try:
            await self._runtime.shutdown()
        finally:
            self._provider._forget(self)


class InProcessProvider:
    """Creates sessions that run in this process. Made by `open_in_process_provider()`."""

    def __init__(self, engine: Engine, nursery: trio.Nursery) -> None:
        self._engine = engine
        self._nursery = nursery
        self._sessions: set[InProcessSession] = set()
        self.closed = False

    async def create_session(self, limits: CellLimits | None = None) -> InProcessSession:
        """A new session with its own cells, stored values and limits.

        Raises:
            InvalidRequestError: invalid limits.
            ProviderClosedError: the provider is closed.
        """
        await trio.lowlevel.checkpoint()
        if self.closed:
            raise ProviderClosedError()
        limits = (limits or CellLimits()).checked()
        session = InProcessSession(self, RuntimeSession(self._engine, self._nursery, limits))
        self._sessions.add(session)
        return session

    def _forget(self, session: InProcessSession) -> None:
        self._sessions.discard(session)

    async def _close(self) -> None:
        self.closed = True
        async with trio.open_nursery() as nursery:
            for session in list(self._sessions):
                nursery.start_soon(_shut_down_quietly, session)


async def _shut_down_quietly(session: InProcessSession) -> None:
    try:
        await session.shutdown()
    except Exception:  # the provider closes whatever one session says; the session knows
        logger.exception("shutting a code-mode session down failed")


@asynccontextmanager
async def open_in_process_provider() -> AsyncIterator[InProcessProvider]:
    """A provider whose sessions run in the caller's trio loop, for the block's duration.

    Resource handling: on exit every session is shut down (its cells terminated, each
    `cell_closed` called), then delegate calls still running are cancelled and the engine's
    threads are joined. The shutdown is shielded and bounded by SHUTDOWN_TIMEOUT.

    Error handling: an exception raised in the block leaves it as itself (never wrapped in an
    `ExceptionGroup`). On a system other than Linux, entering the block raises
    `UnsupportedPlatformError`.
    """
    check_platform()
    async with open_engine() as engine, open_service_nursery() as nursery:
        provider = InProcessProvider(engine, nursery)
        try:
            yield provider
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(SHUTDOWN_TIMEOUT):
                await provider._close()
            nursery.cancel_scope.cancel()
