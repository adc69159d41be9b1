"""The cell's deadlines while its JavaScript runs (rule 9 of `_cell`), and its task's wait for
the JavaScript when it has a task (rule 10).

The wait hands the engine's events to the cell's handler until `Finished`. The cell's
deadlines are alarms of the engine (`Engine.alarms`), not cancel scopes around the wait: the
end of the observer's window, at which the observer is woken; the cell's wall-clock limit
(`CellLimits.max_wall_time_ms`), at which the cell is told its time is up; and, after a
termination, the moment the running turn is abandoned, at which the wait stops. A cancel scope
costs about as much as the rest of a trivial cell's observation
(`docs/performance-history.md`, seventh round), and nearly every window outlives its cell.

The wall-clock limit can be paused and resumed (`pause_limit`, `resume_limit`): time paused
does not count (an approval the cell waits for); time at a pending frontier does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio
from codemode_host.engine import CellEvent, EngineCell

from codemode._trio import Alarm, Alarms

logger = logging.getLogger("codemode.runtime")

ABANDON_AFTER = 0.5
"""Seconds a terminated cell's JavaScript has to stop before its turn is abandoned: a native
call that does not poll the interrupt flag (a huge typed-array sort) runs on, on its worker,
and its runtime is freed when it returns; the termination goes on without it."""


class JavaScriptWait:
    """Waits for one cell's `Finished`, and keeps the cell's deadlines meanwhile.

    It holds no reference to the cell (its callbacks are arguments, and its alarms are
    cancelled when the wait ends): a cell and its wait are no reference cycle, and an ended
    cell is freed by reference counts.

    Args:
        cell_id: the cell's id, for the log.
        engine_cell: the cell whose events are handled.
        alarms: where the deadlines wait (the engine's).
    """

    def __init__(self, cell_id: str, engine_cell: EngineCell, alarms: Alarms) -> None:
        self._cell_id = cell_id
        self._engine_cell = engine_cell
        self._alarms = alarms
        self._window: Alarm | None = None
        self._abandon: Alarm | None = None
        self._limit: Alarm | None = None
        self._limit_left: float | None = None  # seconds left while the limit is paused
        self._expire: Callable[[], object] | None = None  # the paused limit's function
        self._over = False

    def wake_at(self, deadline: float | None, wake: Callable[[], None]) -> None:
        """An observer's window ends at `deadline` (None: not started, or no window): `wake()`
        then. An earlier alarm left by an observer that ended early stays: it merely wakes this
        one early, which finds its window running and asks again."""
        if deadline is None or self._over:
            return
        window = self._window
        if window is not None and window.pending:
            if window.when <= deadline:
                return
            window.cancel()
        self._window = self._alarms.call_at(deadline, wake)

    def limit_at(self, deadline: float, expire: Callable[[], None]) -> None:
        """The cell may run until `deadline` (trio's clock): `expire()` then, unless its
        JavaScript ended first. Set once, when the cell starts."""
        if not self._over:
            self._limit = self._alarms.call_at(deadline, expire)

    def pause_limit(self) -> None:
        """Stop the wall-clock limit's count (nothing without a limit, once it expired, or
        while paused already); `resume_limit` goes on with the time it had left."""
        limit = self._limit
        if limit is None or not limit.pending or self._limit_left is not None:
            return
        self._limit_left = max(0.0, limit.when - trio.current_time())
        self._expire = limit.fn
        limit.cancel()

    def resume_limit(self) -> None:
        """Count the wall-clock limit again, from the time it had left when paused."""
        expire, left = self._expire, self._limit_left
        if expire is None or left is None:
            return
        self._limit_left = self._expire = None
        if not self._over:
            self._limit = self._alarms.call_at(trio.current_time() + left, expire)

    def abandon_soon(self) -> None:
        """The cell was terminated (its JavaScript interrupted): give its running turn up
        `ABANDON_AFTER` from now if it has not ended by then."""
        if not self._over and self._abandon is None:
            self._abandon = self._alarms.call_at(
                trio.current_time() + ABANDON_AFTER, self._engine_cell.stop_handling
            )

    async def run(self, handle: Callable[[CellEvent], None]) -> None:
        """Hand every event to `handle` until `Finished` was handled, or until the turn was
        abandoned."""
        try:
            if await self._engine_cell.handle_until_finished(handle) is None:
                logger.warning(
                    "exec cell %s did not stop within %.1f s of its termination (a native call"
                    " that does not poll interrupts): its turn is abandoned",
                    self._cell_id,
                    ABANDON_AFTER,
                )
        finally:
            self.end()

    def end(self) -> None:
        """The JavaScript ended (its `Finished` handled, with or without a task waiting): the
        deadlines are dropped. Idempotent."""
        self._over = True  # a window can end only while the JavaScript runs
        for alarm in (self._window, self._abandon, self._limit):
            if alarm is not None:
                alarm.cancel()
        self._expire = None  # the cell's bound method: no reference kept past its end
