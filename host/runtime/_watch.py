"""The watch over cells without a task of their own (rule 10 of `_cell`).

Such a cell does not see its nursery cancelled: no task of its is there to be cancelled. One
task does it for all of them: when the nursery is cancelled before their sessions shut down (an
abort: the engine closed, the provider or the connection was cancelled), it closes every cell
still watched, as their own tasks would have.

Rules:
1. One watch per nursery, shared by the sessions whose cells run there (the host's connection,
   the in-process provider); a session made without one has its own, closed at its shutdown. A
   task per session cost about 2.5 KB for every session that ever ran a cell.
2. Its task starts with the first cell watched and ends when its nursery is cancelled or the
   watch is closed.
3. A cell is watched from its start until it closes (its session forgets it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from ._cell import RuntimeCell


class CellWatch:
    """Closes the watched cells if `nursery` is cancelled first (rule 1).

    Args:
        nursery: where the cells' tasks run, and the watch's own.
    """

    def __init__(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery
        self._cells: dict[int, RuntimeCell] = {}
        self._scope: trio.CancelScope | None = None

    def add(self, cell: RuntimeCell) -> None:
        self._cells[id(cell)] = cell
        if self._scope is None:
            # Made here, not in the task: a `close()` before the task's first step ends it.
            self._scope = trio.CancelScope()
            self._nursery.start_soon(self._watch, self._scope)

    def discard(self, cell: RuntimeCell) -> None:
        self._cells.pop(id(cell), None)

    def close(self) -> None:
        """The watch ends (its owner shut down, with no cell left)."""
        if self._scope is not None:
            self._scope.cancel()

    async def _watch(self, scope: trio.CancelScope) -> None:
        with scope:
            try:
                await trio.sleep_forever()
            finally:
                for cell in list(self._cells.values()):
                    cell.abort()
