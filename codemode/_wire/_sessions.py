"""The sessions of a provider whose cells run in hosts: the part every such provider shares.

A process provider and a remote provider (and through it a Ray provider) each hold one
`WireSessions` with their placement strategy (`_placement.Placement`), and hand their sessions'
creation, statistics and close to it.

Rules:
1. A session is opened on a host before `create` returns it; one that could not be opened is
   forgotten at once.
2. The provider forgets a session once its shutdown ended (`forget`): nothing is retained per
   closed session, by the book or by the strategy.
3. Session ids are the provider's, never reused on any of its hosts (a re-opened session gets a
   new one).
4. Closing: placement refuses at once (`ProviderClosedError`), every session is shut down
   (bounded by `shutdown_timeout`: past it every host is aborted), then every host is closed
   (`codemode/_closing.py`).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Generic, TypeVar

import trio

from .._api import CellLimits, ToolThreadLimits, ToolThreadStatistics
from .._closing import close_provider
from .._providers import ProviderStatistics
from .._tool_threads import ToolThreads, use_tool_threads
from .._trio import CLEANUP_GRACE, CallWorkers, open_detached_nursery, open_service_nursery
from ..errors import ProviderClosedError
from ._delegates import LINK_WORKERS
from ._link import HostLink
from ._placement import Placement
from ._session import WireSession

SHUTDOWN_TIMEOUT = 5.0
"""Seconds a provider's exit waits for its sessions' shutdowns before it gives up on the hosts."""

_Opened = TypeVar("_Opened")
_P = TypeVar("_P", bound=Placement)


class WireSessions(Generic[_P]):
    """A wire provider's sessions and the strategy that places them.

    Args:
        placement: where the sessions run (the provider reads its own figures there).
        nursery: the provider's nursery (sessions' shutdowns run there).
        tool_threads: the provider's sync tools' threads (reported by `statistics`).
        kind: the provider's kind, as its cells' spans name it (`process`, `remote`).
    """

    def __init__(
        self,
        placement: _P,
        nursery: trio.Nursery,
        tool_threads: ToolThreads,
        kind: str = "process",
    ) -> None:
        self.placement = placement
        self._kind = kind
        self._nursery = nursery
        self._tool_threads = tool_threads
        self._session_ids = itertools.count(1)
        self._sessions: set[WireSession] = set()
        # An attribute, not a property: every request of every session reads it.
        self.closed = False

    # ---- what a session needs (`_session.SessionOwner`) ----------------------------------------

    @property
    def nursery(self) -> trio.Nursery:
        return self._nursery

    @property
    def announces_replacement(self) -> bool:
        return self.placement.announces_replacement

    def next_session_id(self) -> str:
        return f"session-{next(self._session_ids)}"

    async def place(
        self, session: WireSession, open_on: Callable[[HostLink], Awaitable[_Opened]]
    ) -> _Opened:
        if self.closed:
            raise ProviderClosedError()
        return await self.placement.place(session, open_on)

    def forget(self, session: WireSession) -> None:
        self._sessions.discard(session)
        self.placement.leave(session)

    # ---- what the provider hands over ----------------------------------------------------------

    async def create(
        self, limits: CellLimits | None, *, store_load: bool, keep_stored_values: bool = False
    ) -> WireSession:
        """A new session, opened on the host the strategy finds (rule 1).

        Raises:
            InvalidRequestError: invalid limits.
            ProviderClosedError: the provider is closed.
            Exception: whatever the strategy raised (`HostLostError`, `AdmissionError`, ...).
        """
        if self.closed:
            raise ProviderClosedError()
        session = WireSession(
            self,
            (limits or CellLimits()).checked(),
            store_load=store_load,
            kind=self._kind,
            keep_stored_values=keep_stored_values,
        )
        self._sessions.add(session)
        try:
            await session._bind()
        except BaseException:
            self.forget(session)
            raise
        return session

    def tool_thread_statistics(self) -> ToolThreadStatistics:
        return self._tool_threads.statistics()

    def statistics(self) -> ProviderStatistics:
        hosts = self.placement.hosts()
        return ProviderStatistics(
            hosts=hosts,
            spawned=self.placement.spawned,
            retired=self.placement.retired,
            sessions=len(self._sessions),
            cells=sum(host.cells for host in hosts),
            tool_threads=self._tool_threads.statistics(),
        )

    async def close(self, shutdown_timeout: float, *, bound: float, logger: logging.Logger) -> None:
        """Rule 4: shielded, bounded by `bound` seconds."""
        self.closed = True
        self.placement.closed = True
        await close_provider(
            self._sessions,
            shutdown_timeout=shutdown_timeout,
            bound=bound,
            logger=logger,
            abort=partial(
                self.placement.abort, "timed out shutting down the code-mode host's sessions"
            ),
            release=self.placement.aclose,
        )


@asynccontextmanager
async def open_wire_sessions(
    placement: Callable[[trio.Nursery, CallWorkers], _P],
    *,
    tool_threads: ToolThreadLimits | None,
    shutdown_timeout: float,
    close_bound: float,
    logger: logging.Logger,
    kind: str,
) -> AsyncIterator[WireSessions[_P]]:
    """A wire provider's sessions for the block, placed by the strategy that
    `placement(nursery, workers)` makes.

    Args:
        placement: makes the strategy, given the provider's nursery (where its hosts' links run)
            and the `CallWorkers` its links run the application's delegate calls in.
        tool_threads: the threads the sessions' sync tools run in (default
            `ToolThreadLimits()`).
        shutdown_timeout: rule 4.
        close_bound: seconds the whole exit may take (rule 4: shielded).
        logger: where a session's failed shutdown is logged.
        kind: the provider's kind, as its cells' spans name it (`process`, `remote`).

    Resource handling: the delegate calls run in a detached nursery (leaving the block waits at
    most `CLEANUP_GRACE` for calls that ignore cancellation, then abandons them, logged), with
    sync tools in the provider's own threads (`ToolThreads`), both shared by its links. On exit
    every session is shut down and every host closed (rule 4), then the provider's nursery is
    cancelled.

    Error handling: an exception raised in the block leaves it as itself.
    """
    threads = ToolThreads(tool_threads)
    async with (
        open_detached_nursery(bound=CLEANUP_GRACE) as calls,
        open_service_nursery() as nursery,
    ):
        workers = CallWorkers(calls, keep=LINK_WORKERS)
        use_tool_threads(workers.context, threads)
        sessions = WireSessions(placement(nursery, workers), nursery, threads, kind)
        try:
            yield sessions
        finally:
            await sessions.close(shutdown_timeout, bound=close_bound, logger=logger)
            nursery.cancel_scope.cancel()
