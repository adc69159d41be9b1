"""The client's operations other than observations, from request to `operation/response`.

Observations (initial responses and waits) are `_cellview.Observation`s; everything else a
client connection asks the host is kept here until answered.
"""

from __future__ import annotations

import enum


class Kind(enum.Enum):
    """What a pending operation is: its answer is handled by kind."""

    OPEN = "open"
    EXECUTE = "execute"
    EXECUTE_TO_PENDING = "execute to pending"
    TERMINATE = "terminate"
    SHUTDOWN = "shutdown"
    CELLS = "cells"
    USAGE = "usage"


class PendingOperation:
    """An operation other than an observation, until its `operation/response`.

    `abandoned`: its caller went away (rule 3 applies). `internal`: the connection sent it on
    its own (a terminate or shutdown of rule 3); its answer is not an event.
    """

    __slots__ = ("abandoned", "cell_id", "internal", "kind", "session_id")

    def __init__(
        self, kind: Kind, session_id: str, cell_id: str = "", *, internal: bool = False
    ) -> None:
        self.kind = kind
        self.session_id = session_id
        self.cell_id = cell_id
        self.abandoned = False
        self.internal = internal
