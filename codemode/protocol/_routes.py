"""The host's route of one cell: which execute started it, and what its frames wait for (rule 4
of `_host.py`: reverse calls and `cell/closed` are held back until the initial response is
queued; no reverse call after `cell/closed`)."""

from __future__ import annotations

from collections.abc import Iterable

from ..observability._report import CellReport


class Route:
    """One cell's frames: its execute's id, and what is held back until its initial response."""

    __slots__ = (
        "calls",
        "cell_id",
        "closed",
        "execute_id",
        "initial_sent",
        "report",
        "session_id",
    )

    def __init__(self, session_id: str, cell_id: str, execute_id: int) -> None:
        self.session_id = session_id
        self.cell_id = cell_id
        self.execute_id = execute_id
        self.initial_sent = False
        self.closed = False
        self.calls: set[int] = set()
        self.report: CellReport | None = None  # sent with `cell/closed`


def started_by(routes: Iterable[Route], execute_id: int) -> Route | None:
    """The route, of `routes`, of the cell that execute `execute_id` started, or None."""
    for route in routes:
        if route.execute_id == execute_id:
            return route
    return None
