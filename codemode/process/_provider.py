"""The process provider: one host process, spawned lazily and shared by its sessions.

When the host dies, the next operation of each session spawns exactly one replacement (the
spawn is serialised) and re-opens that session on it under the next generation.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import trio

from .._api import CellLimits
from ..errors import CodeModeError
from ._connection import HANDSHAKE_TIMEOUT, HostConnection, connect
from ._host_process import default_host_command, spawn_host
from ._session import ProcessSession

SHUTDOWN_TIMEOUT = 5.0


class ProcessProvider:
    """Creates sessions served by a host process. Made by `open_process_provider()`."""

    def __init__(self, command: list[str], nursery: trio.Nursery, handshake_timeout: float) -> None:
        self._command = command
        self._handshake_timeout = handshake_timeout
        self._nursery = nursery
        self._connection_now: HostConnection | None = None
        self._spawn_lock = trio.Lock()
        self._session_ids = itertools.count(1)
        self._sessions: list[ProcessSession] = []
        self._closed = False

    async def create_session(self, limits: CellLimits | None = None) -> ProcessSession:
        """A new session, opened on the host at once (spawning it if needed).

        Raises:
            CodeModeError: the host cannot be started, refused the session or its limits.
        """
        if self._closed:
            raise CodeModeError("the code-mode provider is closed")
        session = ProcessSession(self, limits or CellLimits())
        self._sessions.append(session)
        await session._bind()
        return session

    def _next_session_id(self) -> str:
        return f"session-{next(self._session_ids)}"

    async def _connection(self) -> HostConnection:
        async with self._spawn_lock:
            if self._closed:
                raise CodeModeError("the code-mode provider is closed")
            current = self._connection_now
            if current is not None and current.alive:
                return current
            process = await spawn_host(self._command)
            self._connection_now = await connect(process, self._nursery, self._handshake_timeout)
            return self._connection_now

    async def aclose(self, shutdown_timeout: float = SHUTDOWN_TIMEOUT) -> None:
        """Shut every session down, then let the host exit (killed if it does not).

        A host that does not finish the shutdowns within `shutdown_timeout` is killed, which
        fails what is still pending (the sessions' requests wait in shielded scopes).
        """
        self._closed = True
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._kill_after, shutdown_timeout)
            async with trio.open_nursery() as shutdowns:
                for session in self._sessions:
                    shutdowns.start_soon(_shutdown_quietly, session)
            nursery.cancel_scope.cancel()
        if self._connection_now is not None:
            await self._connection_now.aclose()

    async def _kill_after(self, seconds: float) -> None:
        await trio.sleep(seconds)
        if self._connection_now is not None:
            self._connection_now.abort("timed out shutting down the code-mode host's sessions")


async def _shutdown_quietly(session: ProcessSession) -> None:
    try:
        await session.shutdown()
    except CodeModeError:
        pass


@asynccontextmanager
async def open_process_provider(
    host_command: Sequence[str] | None = None,
    *,
    handshake_timeout: float = HANDSHAKE_TIMEOUT,
    shutdown_timeout: float = SHUTDOWN_TIMEOUT,
) -> AsyncIterator[ProcessProvider]:
    """A provider whose sessions run in one host process, for the block's duration.

    Args:
        host_command: the argv of the host program (default: `default_host_command()`).
        handshake_timeout: seconds a freshly spawned host has to answer the handshake; past
            it the host is killed and the operation fails with `timed out negotiating with
            the code-mode host`.
        shutdown_timeout: seconds the exit waits for the sessions' shutdowns before it kills
            the host.

    Resource handling: the host is spawned on first use. On exit every session is shut down
    (the host is killed past `shutdown_timeout`), the host's stdin is closed and the process
    reaped (killed if it has not exited 5 s later), shielded from cancellation; no zombie or
    orphan is left.
    """
    command = list(host_command) if host_command is not None else default_host_command()
    async with trio.open_nursery() as nursery:
        provider = ProcessProvider(command, nursery, handshake_timeout)
        try:
            yield provider
        finally:
            with trio.CancelScope(shield=True):
                await provider.aclose(shutdown_timeout)
            nursery.cancel_scope.cancel()
