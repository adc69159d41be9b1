"""The in-process provider: sessions served by the runtime inside the caller's trio loop.

The same API as the process provider, without a host process: the engine's worker threads
run the JavaScript, and cells, tool calls and notifications are tasks of the provider's
nursery. Documented differences: `host_duration` is always None, and a crash of the engine
takes the application with it (the process provider isolates it).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio
from codemode_host.engine import Engine, open_engine
from codemode_host.runtime import RuntimeSession

from ._api import CellLimits
from .errors import CodeModeError

SHUTDOWN_TIMEOUT = 5.0
"""Seconds the provider's exit waits for its sessions to shut down before cancelling them."""


class InProcessProvider:
    """Creates sessions that run in this process. Made by `open_in_process_provider()`."""

    def __init__(self, engine: Engine, nursery: trio.Nursery) -> None:
        self._engine = engine
        self._nursery = nursery
        self._sessions: list[RuntimeSession] = []
        self._closed = False

    async def create_session(self, limits: CellLimits | None = None) -> RuntimeSession:
        """A new session with its own cells, stored values and limits.

        Raises:
            CodeModeError: invalid limits, or the provider is closed.
        """
        await trio.lowlevel.checkpoint()
        if self._closed:
            raise CodeModeError("the code-mode provider is closed")
        limits = limits or CellLimits()
        problem = limits.problem()
        if problem is not None:
            raise CodeModeError(f"invalid code-mode session execution limits: {problem}")
        session = RuntimeSession(self._engine, self._nursery, limits)
        self._sessions.append(session)
        return session

    async def _shutdown_sessions(self) -> None:
        self._closed = True
        async with trio.open_nursery() as nursery:
            for session in self._sessions:
                nursery.start_soon(session.shutdown)


@asynccontextmanager
async def open_in_process_provider() -> AsyncIterator[InProcessProvider]:
    """A provider whose sessions run in the caller's trio loop, for the block's duration.

    Resource handling: on exit every session is shut down (its cells terminated, each
    `cell_closed` called), then delegate calls still running are cancelled and the engine's
    threads are joined. The shutdown is shielded and bounded by SHUTDOWN_TIMEOUT.
    """
    async with open_engine() as engine, trio.open_nursery() as nursery:
        provider = InProcessProvider(engine, nursery)
        try:
            yield provider
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(SHUTDOWN_TIMEOUT):
                await provider._shutdown_sessions()
            nursery.cancel_scope.cancel()
