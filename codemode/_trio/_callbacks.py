"""Delegate calls of one cell (its tool calls, or its notifications) as cancellable tasks.

Shared by the runtime (calls into the application) and the process provider (calls the host
forwards to the application).

Each call runs as a task of the session's nursery inside its own cancel scope, so the group can
cancel them all without owning a nursery: a cell that ends waits for its calls to return *or*
for a grace period (`wait_idle()` under a timeout), whichever comes first, and a delegate that
shields its cleanup cannot hold the cell hostage (DESIGN section 4). A task left running past
the grace still belongs to the session's nursery, which awaits it.

`all_started()` waits until every task started so far has run its first step: its delegate
has seen the call (a pending frontier is delivered only then).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVarTuple

import trio

Ts = TypeVarTuple("Ts")

CLEANUP_GRACE = 1.0
"""Seconds a closing cell waits for its cancelled delegate calls (DESIGN section 4)."""


class CallbackGroup:
    """Tasks started in a borrowed nursery, each with a cancel scope this group owns."""

    def __init__(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery
        self._scopes: set[trio.CancelScope] = set()
        self._unstarted = 0
        # Made by the first waiter that has to wait, not per call: two events a call showed in
        # profiles of both ends, and most groups are never waited on while busy.
        self._idle: trio.Event | None = None
        self._started: trio.Event | None = None

    def start(self, fn: Callable[[*Ts], Awaitable[object]], *args: *Ts) -> trio.CancelScope:
        """Start `fn(*args)` as a task of the nursery; returns the scope it runs in."""
        scope = trio.CancelScope()
        self._scopes.add(scope)
        self._unstarted += 1
        self._nursery.start_soon(self._run, scope, fn, *args)
        return scope

    async def _run(
        self,
        scope: trio.CancelScope,
        fn: Callable[[*Ts], Awaitable[object]],
        *args: *Ts,
    ) -> None:
        # The waiter of `all_started` runs after this step, which takes `fn` to its first
        # checkpoint: by then the delegate has the call.
        self._unstarted -= 1
        if not self._unstarted and self._started is not None:
            self._started.set()
            self._started = None
        try:
            with scope:
                await fn(*args)
        finally:
            self._scopes.discard(scope)
            if not self._scopes and self._idle is not None:
                self._idle.set()
                self._idle = None

    @property
    def idle(self) -> bool:
        """No task of the group runs (`wait_idle()` would only checkpoint)."""
        return not self._scopes

    @property
    def all_running(self) -> bool:
        """Every task started so far has begun running (`all_started()` would only
        checkpoint)."""
        return not self._unstarted

    def cancel(self, reason: str) -> None:
        """Cancel every task of the group (a task not yet started is cancelled on start)."""
        for scope in self._scopes:
            scope.cancel(reason=reason)

    async def all_started(self) -> None:
        """Wait until every task started so far has begun running."""
        if not self._unstarted:
            await trio.lowlevel.checkpoint()
            return
        if self._started is None:
            self._started = trio.Event()
        await self._started.wait()

    async def wait_idle(self) -> None:
        """Wait until no task of the group runs (bound it with a cancel scope)."""
        if not self._scopes:
            await trio.lowlevel.checkpoint()
            return
        if self._idle is None:
            self._idle = trio.Event()
        await self._idle.wait()
