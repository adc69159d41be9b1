"""The process provider: host processes, spawned lazily and shared by its sessions.

By default one host serves every session (design.md, design 3); `hosts=N` makes a pool of N
(`_pool.py`: placement on the least loaded host, retirement of idle ones). When a host dies,
the next operation of each of its sessions places that session again (with one host: on a
replacement, spawned once, the spawn serialised) and re-opens it there under the next
generation; the other hosts' sessions are not affected.

The sessions, their generations and the provider's close are `codemode._wire`'s, shared with the
remote provider; the pool is this provider's placement strategy, and a host is a `SpawnedHost`
(`_host_process.py`).

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

import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import trio

from .._api import CellLimits, Session, ToolThreadLimits, ToolThreadStatistics
from .._providers import ProviderStatistics
from .._trio import CLEANUP_GRACE, CallWorkers
from .._wire import (
    CLOSE_TIMEOUT,
    HANDSHAKE_TIMEOUT,
    SHUTDOWN_TIMEOUT,
    HostLink,
    WireSessions,
    open_wire_sessions,
)
from ..errors import InvalidRequestError, check_platform
from ._host_process import SpawnedHost, default_host_command
from ._pool import HostPool

IDLE_HOST_TIMEOUT = 30.0
"""Seconds a pool's host with no session is kept before it is retired (the last one is kept)."""

logger = logging.getLogger("codemode.process")


class ProcessProvider:
    """Creates sessions served by host processes (one, or a pool). Made by
    `open_process_provider()`."""

    def __init__(self, sessions: WireSessions[HostPool]) -> None:
        self._sessions = sessions

    @property
    def closed(self) -> bool:
        """True once the provider's block is being left."""
        return self._sessions.closed

    def statistics(self) -> ProviderStatistics:
        """The provider's hosts (for each: its pid, its sessions and its cells), its sessions,
        cells and tool threads."""
        return self._sessions.statistics()

    def tool_thread_statistics(self) -> ToolThreadStatistics:
        """What the threads of the sessions' sync tools hold now (`docs/limits.md`)."""
        return self._sessions.tool_thread_statistics()

    async def create_session(
        self,
        limits: CellLimits | None = None,
        *,
        store_load: bool = True,
        keep_stored_values: bool = False,
    ) -> Session:
        """A new session, opened on the host at once (spawning it if needed); `store_load=False`:
        its cells have no `store` / `load`, and the host keeps nothing.

        Raises:
            InvalidRequestError: invalid limits (checked here, as in-process, and by the host).
            HostLostError: the host cannot be started, or was lost.
            ProviderClosedError: the provider is closed.
        """
        return await self._sessions.create(
            limits, store_load=store_load, keep_stored_values=keep_stored_values
        )


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

    def pool(nursery: trio.Nursery, workers: CallWorkers) -> HostPool:
        def new_link() -> HostLink:
            return HostLink(SpawnedHost(command), handshake_timeout, workers=workers)

        return HostPool(new_link, hosts, idle_host_timeout, nursery)

    async with open_wire_sessions(
        pool,
        tool_threads=tool_threads,
        shutdown_timeout=shutdown_timeout,
        # A spawn in progress finishes before its host is closed: its handshake counts.
        close_bound=shutdown_timeout + handshake_timeout + 2 * (CLOSE_TIMEOUT + CLEANUP_GRACE),
        logger=logger,
        kind="process",
    ) as sessions:
        yield ProcessProvider(sessions)
