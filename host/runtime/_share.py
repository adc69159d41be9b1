"""What a session lends each of its cells (`CellShare`).

Made once per session: a new cell takes one object instead of seven arguments, and the
session's count of uncollected completions lives where its cells keep it.
"""

from __future__ import annotations

from collections.abc import Callable

import trio

from codemode._trio import Alarms, CallWorkers

from ._admission import Admission


class CellShare:
    """The session's parts its cells use.

    Attributes:
        workers: where the cells' delegate calls run.
        admission: the capacity the session shares with the others of its connection.
        alarms: where the cells' deadlines wait (the engine's).
        commit: merges a naturally completed cell's stored-value writes into the session.
        forget: takes a closed cell out of the session's registry (by its id).
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
        "commit",
        "forget",
        "max_response_bytes",
        "now",
        "uncollected",
        "workers",
    )

    def __init__(
        self,
        *,
        workers: CallWorkers,
        admission: Admission,
        alarms: Alarms,
        commit: Callable[[dict[str, bytes]], None],
        forget: Callable[[str], None],
        max_response_bytes: int | None,
    ) -> None:
        self.workers = workers
        self.admission = admission
        self.alarms = alarms
        self.commit = commit
        self.forget = forget
        self.max_response_bytes = max_response_bytes
        self.uncollected = 0
        self.now = trio.lowlevel.current_clock().current_time
