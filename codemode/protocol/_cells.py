"""The client's cells: their views, their observations, and the output parked for them.

`CellBook` is the half of `ClientConnection` that decides who gets which output (the other half
keeps requests, sessions and reverse calls). It follows `_cellview`'s rules: one observer per
cell; a cancelled observation is retired and its answer parked for the next observer; a new
observation waits (deferred) behind a retired one; a cell's view is forgotten once the host
closed it and nothing about it is pending. It appends its events to the connection's queue and
queues its frames through the connection.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Final

from .._api import LiveCell, Pending, RuntimeResponse, WaitOutcome, WaitRequest, Yielded
from ..errors import ErrorKind
from ..observability._report import CellReport, TraceContext
from ._cellview import CellView, Observation, ObservationResult, Phase, Trigger
from ._errors import LocalProtocolError, RemoteProtocolError
from ._events import Answered, CellEnded, InitialAnswered
from ._messages import (
    Err,
    HostResponse,
    Ok,
    OperationCancel,
    OperationRequest,
    Wait,
    WaitCompleted,
    WaitToPending,
)

HostResult = Ok[HostResponse] | Err
InitialResult = Ok[RuntimeResponse | Pending] | Err
Key = tuple[str, str]

# Exact classes of what the host sent (C statics compiled), compared with a response's class
# instead of `isinstance`: a failed `isinstance` against a msgspec class costs about 600
# instructions compiled (its metaclass's `__instancecheck__`), and the decoder makes no
# subclasses. An `isinstance` that matches the object's own class is cheap.
_PENDING: Final = Pending
_YIELDED: Final = Yielded


class CellBook:
    """The views of the cells one client connection knows.

    Args:
        events: the connection's event queue (answers are appended to it).
        queue: queues a frame on the connection.
    """

    def __init__(self, events: collections.deque[object], queue: Callable[[object], None]) -> None:
        self._events = events
        self._queue = queue
        self.cells: dict[Key, CellView] = {}
        self.observations: dict[int, Observation] = {}

    # ---- the user's side -------------------------------------------------------------------

    def admit(
        self, session_id: str, cell_id: str, request_id: int, *, frontier: bool = False
    ) -> CellView:
        """A cell the host started for execute `request_id`; the `StartedCell` holds its
        initial observation (`frontier`: an execute to the pending frontier)."""
        key = (session_id, cell_id)
        if key in self.cells:
            raise RemoteProtocolError(
                f"code-mode host reused live cell {cell_id} in session {session_id}"
            )
        view = self.cells[key] = CellView(session_id, cell_id, request_id, frontier=frontier)
        assert view.observer is not None
        self.observations[request_id] = view.observer
        return view

    def take_initial(self, request_id: int) -> None:
        view = self._held(request_id)
        view.move(Trigger.TAKE_INITIAL)
        if view.held_answer is not None:
            answer, view.held_answer = view.held_answer, None
            self._answer(view, answer)

    def release_initial(self, request_id: int, *, cancel: bool = True) -> None:
        """The `StartedCell` gave its initial observation up (`cancel`: tell the host; False
        when an `operation/cancel` of the execute was sent already)."""
        observation = self.observations.get(request_id)
        view = observation.view if observation is not None else None
        if observation is None or view is None or view.phase is not Phase.HELD:
            return  # already taken, released, or the connection is gone
        view.move(Trigger.RELEASE_INITIAL)
        view.retired, view.observer = observation, None
        if view.held_answer is not None:
            answer, view.held_answer = view.held_answer, None
            self._retired_answer(view, answer)
        elif cancel:
            self._queue(OperationCancel(id=request_id))

    def observe(
        self,
        request_id: int,
        session_id: str,
        cell_id: str,
        window_ms: int,
        *,
        frontier: bool = False,
        trace: TraceContext | None = None,
    ) -> None:
        """A wait (`frontier`: a wait to the pending frontier): answered at once (busy, or from
        parked output), deferred, or sent (with `trace`, when given)."""
        view = self.cells.get((session_id, cell_id))
        if view is not None and view.busy:
            busy = f"exec cell {cell_id} already has an active observer"
            err = Err(kind=ErrorKind.OBSERVER_BUSY, message=busy)
            self._events.append(Answered(request_id=request_id, result=err))
            return
        observation = Observation(
            session_id,
            cell_id,
            request_id,
            view=view,
            window_ms=window_ms,
            frontier=frontier,
            trace=trace,
        )
        self.observations[request_id] = observation
        if view is None:
            self._send(observation)
            return
        view.move(Trigger.OBSERVE)
        view.observer = observation
        if view.phase is Phase.OBSERVING:
            self._answer_or_send(view, observation)

    def observing(self, session_id: str, cell_id: str) -> int | None:
        """The request id of the plain observation of the cell the host is serving (its
        initial response or a wait), or None: what `operation/yield` targets."""
        view = self.cells.get((session_id, cell_id))
        if view is None or view.phase not in (Phase.HELD, Phase.OBSERVING):
            return None
        observation = view.observer
        if observation is None or observation.frontier or observation.answered:
            return None
        return observation.request_id

    def retire(self, request_id: int) -> bool:
        """The caller of observation `request_id` went away; False if it is no observation."""
        observation = self.observations.get(request_id)
        if observation is None:
            return False
        view = observation.view
        if view is None:
            # A wait on a cell this connection does not know: nothing can be parked for it,
            # its answer is dropped.
            observation.retired = True
            self._queue(OperationCancel(id=request_id))
        elif view.observer is not observation:
            pass  # answered already, or retired before
        elif view.phase is Phase.DEFERRED:
            # Never sent: drop it, the retired observation before it stays.
            del self.observations[request_id]
            view.observer = None
            view.move(Trigger.RETIRE)
        else:
            view.move(Trigger.RETIRE)
            view.retired, view.observer = observation, None
            self._queue(OperationCancel(id=request_id))
        return True

    def take_back(self, session_id: str, response: RuntimeResponse | Pending) -> None:
        """Output an answer carried that never reached its caller: parked for the cell's next
        observer (a view is made again if the cell was forgotten meanwhile)."""
        key = (session_id, response.cell_id)
        view = self.cells.get(key)
        if view is None:
            view = self.cells[key] = CellView.parked_for(session_id, response.cell_id)
        view.park(LiveCell(response=response))

    def terminate_now(self, request_id: int, session_id: str, cell_id: str) -> bool:
        """Answer a terminate without the host when possible (a second terminate, or a cell
        whose end is parked); else mark the view terminating. True if answered."""
        view = self.cells.get((session_id, cell_id))
        if view is None:
            return False
        if view.terminating is not None:
            err = Err(
                kind=ErrorKind.ALREADY_TERMINATING,
                message=f"exec cell {cell_id} is already terminating",
            )
            self._events.append(Answered(request_id=request_id, result=err))
            return True
        if view.parked_final is not None:
            outcome = view.merged(LiveCell(response=view.parked_final))
            self._events.append(Answered(request_id=request_id, result=completed(outcome)))
            self.forget_if_done(view)
            return True
        view.terminating = request_id
        return False

    # ---- the host's side ---------------------------------------------------------------

    def terminated(
        self, request_id: int, session_id: str, cell_id: str, result: HostResult
    ) -> HostResult:
        """A terminate's answer, with the cell's parked (and held) output in front."""
        view = self.cells.get((session_id, cell_id))
        if view is not None and view.terminating == request_id:
            view.terminating = None
        if isinstance(result, Ok):
            outcome: ObservationResult = checked_outcome(result.value, cell_id)
            if view is not None:
                outcome = view.terminated(outcome)
            result = completed(outcome)
        if view is not None:
            self.forget_if_done(view)
        return result

    def wait_answered(self, request_id: int, result: HostResult) -> bool:
        """The answer of a wait; False if `request_id` is no wait."""
        observation = self.observations.get(request_id)
        if observation is None or observation.initial:
            return False
        del self.observations[request_id]
        if isinstance(result, Ok):
            answer = checked_outcome(result.value, observation.cell_id)
            _check_kind(observation, answer.response)
            outcome: ObservationResult = answer
        else:
            outcome = result
        self._answered(observation, outcome)
        return True

    def initial_answered(self, request_id: int, result: InitialResult) -> CellView | None:
        """The initial response of execute `request_id`; the view of its cell."""
        observation = self.observations.get(request_id)
        if observation is None or not observation.initial or observation.answered:
            raise RemoteProtocolError(
                f"code-mode host returned initial response for unknown request ID {request_id}"
            )
        observation.answered = True
        if not isinstance(result, Ok):  # the common class first: see `_PENDING`
            self._answered(observation, result)
            return observation.view
        response = result.value
        if response.cell_id != observation.cell_id:
            raise RemoteProtocolError(
                "code-mode host returned initial response for cell"
                f" {response.cell_id} instead of {observation.cell_id}"
            )
        _check_kind(observation, response)
        self._answered(observation, LiveCell(response=response))
        return observation.view

    def initial_closing(self, request_id: int, result: InitialResult) -> CellView:
        """An initial response that closes its cell too (`closing-initial-response`): answered
        as by `initial_answered`; the view of the live cell it closes."""
        view = self.initial_answered(request_id, result)
        if view is None or self.live(view.session_id, view.cell_id) is not view:
            raise RemoteProtocolError(
                f"code-mode host closed no live cell with the initial response of {request_id}"
            )
        return view

    def close(self, view: CellView, report: CellReport | None) -> None:
        """The host closed the cell (its reverse calls were dropped first): its end is an
        event, and its view goes once nothing about it is pending."""
        view.closed = True
        self._events.append(
            CellEnded(session_id=view.session_id, cell_id=view.cell_id, report=report)
        )
        self.forget_if_done(view)

    def held_initials(self) -> dict[int, InitialResult]:
        """The initial responses that arrived and wait for their `StartedCell` to take them."""
        held: dict[int, InitialResult] = {}
        for view in self.cells.values():
            answer, observation = view.held_answer, view.observer
            if view.phase is Phase.HELD and answer is not None and observation is not None:
                held[observation.request_id] = (
                    answer if isinstance(answer, Err) else Ok(value=answer.response)
                )
        return held

    def live(self, session_id: str, cell_id: str) -> CellView | None:
        """The view of a cell the host has not closed, or None."""
        view = self.cells.get((session_id, cell_id))
        return None if view is None or view.closed else view

    def forget_session(self, session_id: str) -> None:
        """The session closed. Observations still unanswered keep their views (their answers
        may follow)."""
        for key in [key for key in self.cells if key[0] == session_id]:
            del self.cells[key]

    def forget_if_done(self, view: CellView) -> None:
        key = (view.session_id, view.cell_id)
        if view.forgettable and self.cells.get(key) is view:
            del self.cells[key]

    # ---- helpers ---------------------------------------------------------------------------

    def _answered(self, observation: Observation, result: ObservationResult) -> None:
        view = observation.view
        if view is None:
            if not observation.retired:
                self._emit(observation, result)
        elif view.retired is observation:
            self._retired_answer(view, result)
        elif view.phase is Phase.HELD:
            view.held_answer = result  # kept (and its observation known) until taken or released
        else:
            self._answer(view, result)

    def _retired_answer(self, view: CellView, result: ObservationResult) -> None:
        view.park(result)
        if view.retired is not None:
            self.observations.pop(view.retired.request_id, None)
        view.retired = None
        view.move(Trigger.RETIRED_ANSWER)
        if view.phase is Phase.OBSERVING:  # a deferred observation may go now
            deferred = view.observer
            assert deferred is not None
            self._answer_or_send(view, deferred)
        self.forget_if_done(view)

    def _answer_or_send(self, view: CellView, observation: Observation) -> None:
        parked = view.parked_answer(observation)
        if parked is not None:
            self._answer(view, parked)
        else:
            self._send(observation)

    def _answer(self, view: CellView, result: ObservationResult) -> None:
        observation = view.observer
        assert observation is not None
        self.observations.pop(observation.request_id, None)
        view.observer = None
        view.move(Trigger.ANSWER)
        self._emit(observation, view.merged(result))
        self.forget_if_done(view)

    def _emit(self, observation: Observation, result: ObservationResult) -> None:
        if observation.initial:
            initial: InitialResult = (
                result if isinstance(result, Err) else Ok(value=result.response)
            )
            self._events.append(InitialAnswered(request_id=observation.request_id, result=initial))
        else:
            self._events.append(
                Answered(request_id=observation.request_id, result=completed(result))
            )

    def _send(self, observation: Observation) -> None:
        wait: Wait | WaitToPending
        if observation.frontier:
            wait = WaitToPending(
                session_id=observation.session_id,
                cell_id=observation.cell_id,
                trace=observation.trace,
            )
        else:
            request = WaitRequest(cell_id=observation.cell_id, yield_time_ms=observation.window_ms)
            wait = Wait(session_id=observation.session_id, request=request, trace=observation.trace)
        self._queue(OperationRequest(id=observation.request_id, request=wait))

    def _held(self, request_id: int) -> CellView:
        observation = self.observations.get(request_id)
        if observation is None or not observation.initial or observation.view is None:
            raise LocalProtocolError(f"no initial response is held for request {request_id}")
        return observation.view


def completed(outcome: WaitOutcome | Err) -> HostResult:
    """A wait or terminate answer carrying `outcome`."""
    if isinstance(outcome, Err):
        return outcome
    answer: HostResult = Ok(value=WaitCompleted(outcome=outcome))
    return answer


def _check_kind(observation: Observation, response: RuntimeResponse | Pending) -> None:
    """Only frontier observations get a `Pending`, and they never get a `Yielded`."""
    if observation.frontier:
        if type(response) is _YIELDED:
            raise RemoteProtocolError(
                "code-mode host returned a yield to a pending-frontier observer"
            )
    elif type(response) is _PENDING:
        raise RemoteProtocolError("code-mode host returned a pending frontier to a plain observer")


def checked_outcome(value: object, cell_id: str) -> WaitOutcome:
    if not isinstance(value, WaitCompleted):
        raise RemoteProtocolError("code-mode host returned an invalid cell response")
    if value.outcome.response.cell_id != cell_id:
        raise RemoteProtocolError(
            f"code-mode host returned cell {value.outcome.response.cell_id}"
            f" for request targeting {cell_id}"
        )
    return value.outcome
