"""A cell's timers (`setTimeout`): each is an alarm of the engine (`Engine.alarms`), which fires
through the cell's frontier (which holds the firing while the cell is paused). Not a task with
a cancel scope per timer: that cost a timer two of trio's dearest operations, and timers that
come due together now fire in the order they were set.

Its alarms refer to the cell (through `fire`) until they fire or are cancelled; the cell cancels
them all when its JavaScript ends, so an ended cell is freed by reference counts.
"""

from __future__ import annotations

from collections.abc import Callable

import trio

from codemode._trio import Alarm, Alarms


class CellTimers:
    """The pending timers of one cell.

    Args:
        alarms: where the timers wait (the engine's).
        submit: runs a command for the engine now, or later if the cell is paused.
    """

    def __init__(self, alarms: Alarms, submit: Callable[[Callable[[], None]], None]) -> None:
        self._alarms = alarms
        self._submit = submit
        self._pending: dict[int, Alarm] = {}

    def start(self, timer_id: int, delay_ms: int, fire: Callable[[int], None]) -> None:
        """`fire(timer_id)` is submitted once `delay_ms` passed, unless cleared first."""

        def due() -> None:
            del self._pending[timer_id]
            self._submit(lambda: fire(timer_id))

        when = trio.current_time() + delay_ms / 1000
        self._pending[timer_id] = self._alarms.call_at(when, due)

    def clear(self, timer_id: int) -> None:
        """`clearTimeout`: the timer never fires (nothing if it fired or is unknown)."""
        cleared = self._pending.pop(timer_id, None)
        if cleared is not None:
            cleared.cancel()

    def cancel_all(self) -> None:
        """The JavaScript ended: no timer fires any more."""
        for alarm in self._pending.values():
            alarm.cancel()
        self._pending.clear()
