"""The client's view of one live cell: who observes it, and output parked for it.

A cell has one observer at a time. On the client that observer is the initial response held by a
`StartedCell`, or a `wait` in flight. When its caller goes away (cancelled, or the `StartedCell`
released) the observation is *retired*: its request is cancelled on the host, but the host may
already have taken output from the cell, so its answer is *parked* and handed to the cell's next
observer instead of being dropped. A new observation made while a retired one is still
unanswered is *deferred*: no frame is sent until the retired answer arrived (design.md, host 4.3).

Rules:
1. Every phase change goes through `OBSERVATION` (`move`); nothing assigns a phase by hand.
2. Parked output: the items of a retired `Yielded` are prepended to the next answer about the
   cell (wait, initial response or terminate); a retired terminal response (`Completed`,
   `Terminated`) *is* the next answer, with nothing sent to the host. A retired `Pending` (the
   host delivered the frontier and keeps the cell paused) is the next *frontier* observation's
   answer, with nothing sent; a plain observation gets its items in front and resumes the cell.
3. A view is forgotten once the host closed the cell and nothing about it is pending or parked.
"""

from __future__ import annotations

import enum

import msgspec

from .._api import (
    Completed,
    ContentItem,
    LiveCell,
    Pending,
    RuntimeResponse,
    Terminated,
    WaitOutcome,
    Yielded,
)
from ..observability._report import TraceContext
from ._errors import LocalProtocolError
from ._messages import Err
from ._statetable import StateTable

ObservationResult = WaitOutcome | Err
"""What an observation comes back with: the outcome, or the error the host gave."""


class Phase(enum.Enum):
    HELD = "held"
    """The initial observation belongs to a `StartedCell` that neither took nor released it."""
    IDLE = "idle"
    """No observer."""
    OBSERVING = "observing"
    """A caller awaits an observation (its initial response or a wait)."""
    RETIRING = "retiring"
    """A retired observation's answer is still to come."""
    DEFERRED = "deferred"
    """As RETIRING, and a new observation waits for that answer before it is sent."""


class Trigger(enum.Enum):
    TAKE_INITIAL = "take initial"
    RELEASE_INITIAL = "release initial"
    OBSERVE = "observe"
    ANSWER = "answer"
    RETIRE = "retire"
    RETIRED_ANSWER = "retired answer"


OBSERVATION: StateTable[Phase, Trigger] = StateTable(
    "client cell observation",
    {
        Phase.HELD: {
            Trigger.TAKE_INITIAL: Phase.OBSERVING,
            Trigger.RELEASE_INITIAL: Phase.RETIRING,
        },
        Phase.IDLE: {Trigger.OBSERVE: Phase.OBSERVING},
        Phase.OBSERVING: {Trigger.ANSWER: Phase.IDLE, Trigger.RETIRE: Phase.RETIRING},
        Phase.RETIRING: {Trigger.OBSERVE: Phase.DEFERRED, Trigger.RETIRED_ANSWER: Phase.IDLE},
        Phase.DEFERRED: {Trigger.RETIRE: Phase.RETIRING, Trigger.RETIRED_ANSWER: Phase.OBSERVING},
    },
    error=LocalProtocolError,
)


class Observation:
    """One observation of a cell: the initial response (keyed by its execute's request id) or
    a wait. `view` is None for a wait on a cell this connection never saw (the host answers
    it, typically with a missing cell)."""

    __slots__ = (
        "answered",
        "cell_id",
        "frontier",
        "initial",
        "request_id",
        "retired",
        "session_id",
        "trace",
        "view",
        "window_ms",
    )

    def __init__(
        self,
        session_id: str,
        cell_id: str,
        request_id: int,
        *,
        view: CellView | None,
        initial: bool = False,
        window_ms: int = 0,
        frontier: bool = False,
        trace: TraceContext | None = None,
    ) -> None:
        self.session_id = session_id
        self.frontier = frontier  # observes to the pending frontier (never a Yielded)
        self.cell_id = cell_id
        self.request_id = request_id
        self.view = view
        self.initial = initial
        self.window_ms = window_ms
        self.answered = False
        self.retired = False  # only for a wait without a view (see `ClientConnection.cancel`)
        self.trace = trace  # sent with the wait, when the host takes it


class CellView:
    """What the client knows of one cell of one session."""

    __slots__ = (
        "calls",
        "cell_id",
        "closed",
        "held_answer",
        "observer",
        "parked_final",
        "parked_frontier",
        "parked_items",
        "phase",
        "retired",
        "session_id",
        "terminating",
    )

    def __init__(
        self, session_id: str, cell_id: str, initial: int, *, frontier: bool = False
    ) -> None:
        self.session_id = session_id
        self.cell_id = cell_id
        self.phase = Phase.HELD
        self.observer: Observation | None = Observation(
            session_id, cell_id, initial, view=self, initial=True, frontier=frontier
        )
        self.retired: Observation | None = None
        self.held_answer: ObservationResult | None = None
        self.parked_items: list[ContentItem] = []
        self.parked_final: Completed | Terminated | None = None
        self.parked_frontier: list[str] | None = None  # the tool call ids of a parked Pending
        self.terminating: int | None = None
        self.calls: set[int] = set()
        self.closed = False

    @classmethod
    def parked_for(cls, session_id: str, cell_id: str) -> CellView:
        """A view of a closed cell, made again to keep output nobody received."""
        view = cls(session_id, cell_id, 0)
        view.phase, view.observer, view.closed = Phase.IDLE, None, True
        return view

    def move(self, trigger: Trigger) -> None:
        self.phase = OBSERVATION.move(self.phase, trigger)

    @property
    def busy(self) -> bool:
        """Whether a new observation must be refused (one observer at a time)."""
        return self.phase in (Phase.HELD, Phase.OBSERVING, Phase.DEFERRED)

    @property
    def forgettable(self) -> bool:
        return (
            self.closed
            and self.phase is Phase.IDLE
            and self.terminating is None
            and not self.calls
            and not self.parked_items
            and self.parked_final is None
            and self.parked_frontier is None
        )

    def park(self, outcome: ObservationResult) -> None:
        """Keep what a retired observation took from the cell for the next observer."""
        if not isinstance(outcome, LiveCell):
            return  # an error or a missing cell: nothing was taken
        response = outcome.response
        if isinstance(response, Completed | Terminated):
            items = [*self.parked_items, *response.content_items]
            self.parked_final = msgspec.structs.replace(response, content_items=items)
            self.parked_items = []
            self.parked_frontier = None
        else:
            self.parked_items.extend(response.content_items)
            if isinstance(response, Pending):
                ids = [*(self.parked_frontier or []), *response.pending_tool_call_ids]
                self.parked_frontier = ids

    def parked_answer(self, observation: Observation) -> ObservationResult | None:
        """The answer `observation` gets without asking the host (rule 2), or None."""
        if self.parked_final is not None:
            return LiveCell(response=self.parked_final)
        if observation.frontier and self.parked_frontier is not None:
            ids, self.parked_frontier = self.parked_frontier, None
            items, self.parked_items = self.parked_items, []
            pending = Pending(cell_id=self.cell_id, content_items=items, pending_tool_call_ids=ids)
            return LiveCell(response=pending)
        return None

    def merged(self, outcome: ObservationResult) -> ObservationResult:
        """`outcome` with the parked output in front of its own (rule 2); clears the parking.
        An error leaves the parked output for the observation after it."""
        if isinstance(outcome, Err):
            return outcome
        if self.parked_final is not None:
            final, self.parked_final = self.parked_final, None
            return LiveCell(response=final)
        self.parked_frontier = None  # the host resumed the cell past that frontier
        items = self.parked_items
        if not items:
            return outcome  # nothing parked (the common case): no list made per answer
        self.parked_items = []
        return self._prepended(outcome, items)

    def terminated(self, outcome: ObservationResult) -> ObservationResult:
        """A terminate's answer: as `merged`, and it also carries what an initial response
        still held for the `StartedCell` holds (the cell ends: a terminate hands over all its
        output, as in-process, where the held observation and the terminator share it)."""
        result = self.merged(outcome)
        held = self.held_answer
        if (
            self.phase is Phase.HELD
            and isinstance(held, LiveCell)
            and isinstance(held.response, Yielded)
            and not isinstance(result, Err)
        ):
            result = self._prepended(result, held.response.content_items)
        return result

    def _prepended(self, outcome: WaitOutcome, items: list[ContentItem]) -> WaitOutcome:
        if not items:
            return outcome
        response: RuntimeResponse | Pending = outcome.response
        if isinstance(outcome, LiveCell):
            merged = msgspec.structs.replace(
                response, content_items=[*items, *response.content_items]
            )
            return LiveCell(response=merged)
        # The host no longer knows the cell; its parked output is its last word.
        return LiveCell(response=Terminated(cell_id=self.cell_id, content_items=items))
