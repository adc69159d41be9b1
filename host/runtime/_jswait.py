"""The cell task's wait for its JavaScript, which keeps the cell's one deadline (rule 9 of
`_cell`).

The wait hands the engine's events to the cell's handler until `Finished`. Its cancel scope
carries the deadline: the end of the observer's window, at which the observer is woken and the
wait goes on, or, after a termination, the time the running turn is abandoned. One scope a
cell, instead of one per sleep of an observer: a trio cancel scope costs about as much as the
rest of a trivial cell's observation.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import trio
from codemode_host.engine import CellEvent, EngineCell, Finished

logger = logging.getLogger("codemode.runtime")

ABANDON_AFTER = 0.5
"""Seconds a terminated cell's JavaScript has to stop before its turn is abandoned: a native
call that does not poll the interrupt flag (a huge typed-array sort) runs on, on its worker,
and its runtime is freed when it returns; the termination goes on without it."""


class JavaScriptWait:
    """Waits for one cell's `Finished`, with a deadline the cell moves.

    It holds no reference to the cell (its callbacks are `run`'s arguments): a cell and its
    wait are no reference cycle, and an ended cell is freed by reference counts.

    Args:
        cell_id: the cell's id, for the log.
        engine_cell: the cell whose events are handled.
    """

    def __init__(self, cell_id: str, engine_cell: EngineCell) -> None:
        self._cell_id = cell_id
        self._engine_cell = engine_cell
        self._scope = trio.CancelScope()
        self._abandon_at = math.inf
        self._finished = False

    def wake_at(self, deadline: float | None) -> None:
        """An observer's window ends at `deadline` (None: not started, or no window); the
        deadline only moves earlier, and a stale one merely wakes the observer early, which
        then finds its window running and asks again."""
        if deadline is not None and deadline < self._scope.deadline:
            self._scope.deadline = deadline

    def abandon_soon(self) -> None:
        """The cell was terminated (its JavaScript interrupted): give its running turn up
        `ABANDON_AFTER` from now if it has not ended by then."""
        self._abandon_at = trio.current_time() + ABANDON_AFTER
        self._scope.deadline = self._abandon_at

    async def run(
        self, handle: Callable[[CellEvent], None], window_ended: Callable[[], None]
    ) -> None:
        """Hand every event to `handle` until `Finished` was handled, or until the turn was
        abandoned; `window_ended()` wakes the observer whose window ended (it then yields)."""

        def handle_one(event: CellEvent) -> None:
            if isinstance(event, Finished):
                self._finished = True
            handle(event)

        while True:
            with self._scope:
                await self._engine_cell.handle_until_finished(handle_one)
                return
            if self._finished:
                return  # its Finished was handled as the deadline passed
            if trio.current_time() >= self._abandon_at:
                logger.warning(
                    "exec cell %s did not stop within %.1f s of its termination (a native call"
                    " that does not poll interrupts): its turn is abandoned",
                    self._cell_id,
                    ABANDON_AFTER,
                )
                return
            self._scope = trio.CancelScope(deadline=self._abandon_at)
            window_ended()
