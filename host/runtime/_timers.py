"""A cell's timers (`setTimeout`): each waits as a task in the session's nursery, in a cancel
scope of its own, and fires through the cell's frontier (which holds the firing while the cell
is paused). Not a nursery per cell: that cost every cell a pass of the scheduler.

This holds no reference to the cell (only the frontier's `submit`): a cell and its timers are
no reference cycle, and an ended cell is freed by reference counts.
"""

from __future__ import annotations

from collections.abc import Callable

import trio


class CellTimers:
    """The pending timers of one cell.

    Args:
        nursery: where the timers wait (the session's).
        submit: runs a command for the engine now, or later if the cell is paused.
    """

    def __init__(self, nursery: trio.Nursery, submit: Callable[[Callable[[], None]], None]) -> None:
        self._nursery = nursery
        self._submit = submit
        self._scopes: dict[int, trio.CancelScope] = {}

    def start(self, timer_id: int, delay_ms: int, fire: Callable[[int], None]) -> None:
        """`fire(timer_id)` is submitted once `delay_ms` passed, unless cleared first."""
        scope = trio.CancelScope()
        self._scopes[timer_id] = scope
        self._nursery.start_soon(self._wait, timer_id, delay_ms, scope, fire)

    def clear(self, timer_id: int) -> None:
        """`clearTimeout`: the timer never fires (nothing if it fired or is unknown)."""
        cleared = self._scopes.pop(timer_id, None)
        if cleared is not None:
            cleared.cancel()

    def cancel_all(self) -> None:
        """The JavaScript ended: no timer fires any more."""
        for scope in self._scopes.values():
            scope.cancel()
        self._scopes.clear()

    async def _wait(
        self,
        timer_id: int,
        delay_ms: int,
        scope: trio.CancelScope,
        fire: Callable[[int], None],
    ) -> None:
        with scope:
            await trio.sleep(delay_ms / 1000)
            self._scopes.pop(timer_id, None)
            self._submit(lambda: fire(timer_id))
