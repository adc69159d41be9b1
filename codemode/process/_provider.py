"""The process provider: one host process, spawned lazily and shared by its sessions.

When the host dies, the next operation of each session spawns exactly one replacement (the
spawn is serialised) and re-opens that session on it under the next generation.

Rules:
1. A link's tasks run in the link's own nursery, started in the provider's with
   `nursery.start` once the host answered the handshake.
2. The provider forgets a session once it is shut down: nothing is retained per closed session.
3. Leaving the block shuts every session down; a host that has not finished within
   `shutdown_timeout` is killed (what is pending fails). The host's stdin is then closed and
   the process reaped, shielded and bounded. An exception raised in the block leaves it as
   itself, never wrapped in an `ExceptionGroup`.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import trio

from .._api import CellLimits
from .._trio import CLEANUP_GRACE, open_service_nursery
from ..errors import ProviderClosedError, check_platform
from ._connection import CLOSE_TIMEOUT, HANDSHAKE_TIMEOUT, HostLink
from ._host_process import default_host_command
from ._session import ProcessSession

SHUTDOWN_TIMEOUT = 5.0

logger = logging.getLogger("codemode.process")


class ProcessProvider:
    """Creates sessions served by a host process. Made by `open_process_provider()`."""

    def __init__(self, command: list[str], nursery: trio.Nursery, handshake_timeout: float) -> None:
        self._command = command
        self._handshake_timeout = handshake_timeout
        self._nursery = nursery
        self._current: HostLink | None = None
        self._spawn_lock = trio.Lock()
        self._session_ids = itertools.count(1)
        self._sessions: set[ProcessSession] = set()
        self.closed = False

    async def create_session(
        self, limits: CellLimits | None = None, *, store_load: bool = True
    ) -> ProcessSession:
        """A new session, opened on the host at once (spawning it if needed); `store_load=False`:
        its cells have no `store` / `load`, and the host keeps nothing.

        Raises:
            InvalidRequestError: invalid limits (checked here, as in-process, and by the host).
            HostLostError: the host cannot be started, or was lost.
            ProviderClosedError: the provider is closed.
        """
        if self.closed:
            raise ProviderClosedError()
        limits = (limits or CellLimits()).checked()
        session = ProcessSession(self, limits, store_load=store_load)
        self._sessions.add(session)
        try:
            await session._bind()
        except BaseException:
            self._sessions.discard(session)
            raise
        return session

    def _forget(self, session: ProcessSession) -> None:
        self._sessions.discard(session)

    def _next_session_id(self) -> str:
        return f"session-{next(self._session_ids)}"

    async def _link(self) -> HostLink:
        """The live link, spawning a host (one at a time) if there is none."""
        async with self._spawn_lock:
            if self.closed:
                raise ProviderClosedError()
            current = self._current
            if current is not None and current.alive:
                return current
            link = HostLink(self._command, self._handshake_timeout)
            await self._nursery.start(link.run)
            self._current = link
            return link

    async def _close(self, shutdown_timeout: float) -> None:
        """Shut every session down, then let the host exit (killed if it does not)."""
        self.closed = True
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._kill_after, shutdown_timeout)
                async with trio.open_nursery() as shutdowns:
                    for session in list(self._sessions):
                        shutdowns.start_soon(_shut_down_quietly, session)
                nursery.cancel_scope.cancel()
        finally:
            if self._current is not None:
                await self._current.aclose()

    async def _kill_after(self, seconds: float) -> None:
        await trio.sleep(seconds)
        if self._current is not None:
            self._current.abort("timed out shutting down the code-mode host's sessions")


async def _shut_down_quietly(session: ProcessSession) -> None:
    try:
        await session.shutdown()
    except Exception:  # the provider closes whatever one session says; the session knows
        logger.exception("shutting a code-mode session down failed")


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
            it the host is killed and the operation fails with `HostLostError` (`timed out
            negotiating with the code-mode host`).
        shutdown_timeout: seconds the exit waits for the sessions' shutdowns before it kills
            the host.

    Resource handling: the host is spawned on first use. On exit every session is shut down
    (the host is killed past `shutdown_timeout`), the host's stdin is closed and the process
    reaped (killed if it has not exited 5 s later), shielded from cancellation; no zombie or
    orphan is left.

    Error handling: an exception raised in the block leaves it as itself. On a system other
    than Linux, entering the block raises `UnsupportedPlatformError`.
    """
    check_platform()
    command = list(host_command) if host_command is not None else default_host_command()
    async with open_service_nursery() as nursery:
        provider = ProcessProvider(command, nursery, handshake_timeout)
        try:
            yield provider
        finally:
            bound = shutdown_timeout + 2 * (CLOSE_TIMEOUT + CLEANUP_GRACE)
            with trio.CancelScope(shield=True), trio.move_on_after(bound):
                await provider._close(shutdown_timeout)
            nursery.cancel_scope.cancel()
