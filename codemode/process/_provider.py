"""The process provider: host processes, spawned lazily and shared by its sessions.

By default one host serves every session (design.md, design 3); `hosts=N` makes a pool of N
(`_pool.py`: placement on the least loaded host, retirement of idle ones). When a host dies,
the next operation of each of its sessions places that session again (with one host: on a
replacement, spawned once, the spawn serialised) and re-opens it there under the next
generation; the other hosts' sessions are not affected.

Rules:
1. A link's tasks run in the link's own nursery, started in the provider's with
   `nursery.start` once the host answered the handshake.
2. The provider forgets a session once it is shut down: nothing is retained per closed session.
3. Leaving the block shuts every session down; a host that has not finished within
   `shutdown_timeout` is killed (what is pending fails). The hosts' stdin is then closed and
   the processes reaped, shielded and bounded. An exception raised in the block leaves it as
   itself, never wrapped in an `ExceptionGroup`.
4. The application's delegate calls run in the provider's `CallWorkers`, shared by its links:
   tasks of a detached nursery (leaving the block waits at most `CLEANUP_GRACE` for calls that
   ignore cancellation, then abandons them, logged), with sync tools in the provider's own
   threads (`ToolThreads`).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import trio

from .._api import CellLimits, ToolThreadLimits, ToolThreadStatistics
from .._tool_threads import ToolThreads, use_tool_threads
from .._trio import CLEANUP_GRACE, CallWorkers, open_detached_nursery, open_service_nursery
from .._wire import CLOSE_TIMEOUT, HANDSHAKE_TIMEOUT, LINK_WORKERS, HostLink, ProcessSession
from ..errors import InvalidRequestError, ProviderClosedError, check_platform
from ._host_process import SpawnedHost, default_host_command
from ._pool import HostPool, ProviderStatistics

SHUTDOWN_TIMEOUT = 5.0
IDLE_HOST_TIMEOUT = 30.0
"""Seconds a pool's host with no session is kept before it is retired (the last one is kept)."""

logger = logging.getLogger("codemode.process")


class ProcessProvider:
    """Creates sessions served by host processes (one, or a pool). Made by
    `open_process_provider()`."""

    def __init__(
        self,
        command: list[str],
        nursery: trio.Nursery,
        handshake_timeout: float,
        *,
        hosts: int = 1,
        idle_host_timeout: float = IDLE_HOST_TIMEOUT,
        calls: trio.Nursery,
        tool_threads: ToolThreads,
    ) -> None:
        self._nursery = nursery
        self._tool_threads = tool_threads
        workers = CallWorkers(calls, keep=LINK_WORKERS)  # rule 4
        use_tool_threads(workers.context, self._tool_threads)
        self._pool = HostPool(
            lambda: HostLink(SpawnedHost(command), handshake_timeout, workers=workers),
            hosts,
            idle_host_timeout,
            nursery,
        )
        self._session_ids = itertools.count(1)
        self._sessions: set[ProcessSession] = set()
        self.closed = False

    def statistics(self) -> ProviderStatistics:
        """The provider's hosts: for each, its pid, its sessions and its cells."""
        return self._pool.statistics()

    def tool_thread_statistics(self) -> ToolThreadStatistics:
        """What the threads of the sessions' sync tools hold now (`docs/limits.md`)."""
        return self._tool_threads.statistics()

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
            self._forget(session)
            raise
        return session

    def _forget(self, session: ProcessSession) -> None:
        self._sessions.discard(session)
        self._pool.leave(session)

    def _next_session_id(self) -> str:
        return f"session-{next(self._session_ids)}"

    async def _link(self, session: ProcessSession) -> HostLink:
        """A live host for `session`, which has none (or lost it): placed anew, on a host that
        is spawned (one spawn at a time per host) if needed."""
        if self.closed:
            raise ProviderClosedError()
        return await self._pool.link_for(session)

    async def _close(self, shutdown_timeout: float) -> None:
        """Shut every session down, then let the hosts exit (killed if they do not)."""
        self.closed = True
        self._pool.closed = True
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._kill_after, shutdown_timeout)
                async with trio.open_nursery() as shutdowns:
                    for session in list(self._sessions):
                        shutdowns.start_soon(_shut_down_quietly, session)
                nursery.cancel_scope.cancel()
        finally:
            await self._pool.aclose()

    async def _kill_after(self, seconds: float) -> None:
        await trio.sleep(seconds)
        self._pool.abort("timed out shutting down the code-mode host's sessions")


async def _shut_down_quietly(session: ProcessSession) -> None:
    try:
        await session.shutdown()
    except Exception:  # the provider closes whatever one session says; the session knows
        logger.exception("shutting a code-mode session down failed")


@asynccontextmanager
async def open_process_provider(
    host_command: Sequence[str] | None = None,
    *,
    hosts: int = 1,
    idle_host_timeout: float = IDLE_HOST_TIMEOUT,
    handshake_timeout: float = HANDSHAKE_TIMEOUT,
    shutdown_timeout: float = SHUTDOWN_TIMEOUT,
    tool_threads: ToolThreadLimits | None = None,
) -> AsyncIterator[ProcessProvider]:
    """A provider whose sessions run in host processes (one by default), for the block's
    duration.

    Args:
        host_command: the argv of the host program (default: `default_host_command()`).
        hosts: how many host processes may serve the sessions at once. 1 (the default): one
            host shared by every session (design.md, design 3). N > 1: a pool; each new session
            is placed on the least loaded host (fewest active cells, then fewest sessions,
            then the lowest index) and stays there; a host that dies affects only its own
            sessions, which re-open on the least loaded host (often its replacement) under the
            next generation (`g2:1`).
        idle_host_timeout: seconds a pool's host with no session is kept before it is
            retired (its process closed); the pool's last live host is never retired, so with
            `hosts=1` the host lives as long as the provider.
        handshake_timeout: seconds a freshly spawned host has to answer the handshake; past
            it the host is killed and the operation fails with `HostLostError` (`timed out
            negotiating with the code-mode host`).
        shutdown_timeout: seconds the exit waits for the sessions' shutdowns before it kills
            the hosts.
        tool_threads: the threads the sessions' sync tools run in (default
            `ToolThreadLimits()`; `docs/limits.md`).

    Raises:
        InvalidRequestError: `hosts` is below 1 or `idle_host_timeout` is negative.

    Resource handling: a host is spawned when a session placed on it first needs it. On exit
    every session is shut down (the hosts are killed past `shutdown_timeout`), each host's
    stdin is closed and its process reaped (killed if it has not exited 5 s later), shielded
    from cancellation; no zombie or orphan is left.

    Error handling: an exception raised in the block leaves it as itself. On a system other
    than Linux, entering the block raises `UnsupportedPlatformError`.
    """
    check_platform()
    if isinstance(hosts, bool) or not isinstance(hosts, int) or hosts < 1:
        raise InvalidRequestError(
            f"invalid code-mode host pool: hosts must be at least 1, not {hosts!r}"
        )
    if not idle_host_timeout >= 0:
        raise InvalidRequestError(
            "invalid code-mode host pool: idle_host_timeout must be at least 0,"
            f" not {idle_host_timeout!r}"
        )
    command = list(host_command) if host_command is not None else default_host_command()
    threads = ToolThreads(tool_threads)
    async with (
        open_detached_nursery(bound=CLEANUP_GRACE) as calls,
        open_service_nursery() as nursery,
    ):
        provider = ProcessProvider(
            command,
            nursery,
            handshake_timeout,
            hosts=hosts,
            idle_host_timeout=idle_host_timeout,
            calls=calls,
            tool_threads=threads,
        )
        try:
            yield provider
        finally:
            # A spawn in progress finishes before its host is closed: its handshake counts.
            bound = shutdown_timeout + handshake_timeout + 2 * (CLOSE_TIMEOUT + CLEANUP_GRACE)
            with trio.CancelScope(shield=True), trio.move_on_after(bound):
                await provider._close(shutdown_timeout)
            nursery.cancel_scope.cancel()
