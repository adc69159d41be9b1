"""What a session lends each of its cells (`CellShare`).

Made once per session: a new cell takes one object instead of six arguments, and the
session's count of uncollected completions lives where its cells keep it. Nothing in it refers
to the session itself (a bound method of the session here would make every session a reference
cycle, left to the cyclic collector).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import trio

from codemode._trio import Alarms, CallWorkers

from ._admission import Admission
from ._budget import SessionBudget
from ._watch import CellWatch

if TYPE_CHECKING:
    from ._cell import RuntimeCell


class CellShare:
    """The session's parts its cells use.

    Attributes:
        workers: where the cells' delegate calls run.
        admission: the capacity the session shares with the others of its connection.
        budget: the session's budgets and what its cells used (`_budget`).
        wall_time_ms: how long each cell may run (None: no wall-clock limit).
        alarms: where the cells' deadlines wait (the engine's).
        commit: merges a naturally completed cell's stored-value writes into the session.
        cells: the session's registry of live cells, by id (its `_cells`).
        watch: the watch over the cells without a task (`_watch`).
        max_response_bytes: the most output one observation takes (None: no limit).
        uncollected: the session's cells that hold a completion nobody collected (the
            COMPLETED state), counted by the cells as they enter and leave it, so that
            admitting a cell never walks the session's cells (rule 2 of `_admission`).
        now: trio's clock (`trio.current_time()` without its two lookups: a cell reads it at
            every event). Made in the session's trio run, so it reads that run's clock.
    """

    __slots__ = (
        "admission",
        "alarms",
        "budget",
        "cells",
        "commit",
        "max_response_bytes",
        "now",
        "uncollected",
        "wall_time_ms",
        "watch",
        "workers",
    )

    def __init__(
        self,
        *,
        workers: CallWorkers,
        admission: Admission,
        alarms: Alarms,
        commit: Callable[[dict[str, bytes]], None],
        cells: dict[str, RuntimeCell],
        watch: CellWatch,
        max_response_bytes: int | None,
        budget: SessionBudget,
        wall_time_ms: int | None = None,
    ) -> None:
        self.workers = workers
        self.admission = admission
        self.budget = budget
        self.wall_time_ms = wall_time_ms
        self.alarms = alarms
        self.commit = commit
        self.cells = cells
        self.watch = watch
        self.max_response_bytes = max_response_bytes
        self.uncollected = 0
        self.now = trio.lowlevel.current_clock().current_time

    def forget(self, cell: RuntimeCell) -> None:
        """Take a closed cell out of the session's registry and out of the watch."""
        if self.cells.pop(cell.cell_id, None) is not None:
            self.watch.discard(cell)
