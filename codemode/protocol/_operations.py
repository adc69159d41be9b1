"""The client's operations other than observations, from request to `operation/response`.

Observations (initial responses and waits) are `_cellview.Observation`s; everything else a
client connection asks the host is kept here until answered (`OperationBook`): the request
ids, the frames queued for them, and what each answer means (the session book moves, a
started cell is admitted to the cell book, an abandoned one terminated, the answer becomes an
`Answered` event unless the connection sent the request on its own).
"""

from __future__ import annotations

import collections
import enum
from collections.abc import Callable
from typing import Any, Final, assert_never

import msgspec

from ..errors import InvalidRequestError
from ._cells import CellBook
from ._codec import FrameTooLargeError
from ._errors import RemoteProtocolError
from ._events import Answered
from ._messages import (
    CellList,
    Err,
    ExecutionStarted,
    HostRequest,
    HostResponse,
    Ok,
    OperationRequest,
    SessionClosed,
    SessionReady,
    ShutdownSession,
    Terminate,
    UsageReport,
)
from ._states import SessionBook, SessionState, SessionTrigger

HostResult = Ok[HostResponse] | Err

_TERMINATE: Final = Terminate
"""Compared with a request's class (a C static compiled): a failed `isinstance` against a
msgspec class costs about 600 instructions compiled, and every execute failed it."""


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


class OperationBook:
    """A client connection's operations in flight (not its observations), by request id."""

    def __init__(
        self,
        events: collections.deque[Any],
        queue: Callable[[object], None],
        sessions: SessionBook,
        cells: CellBook,
    ) -> None:
        self._events = events
        self._queue = queue
        self._sessions = sessions
        self._cells = cells
        self._next = 1
        self.pending: dict[int, PendingOperation] = {}

    def answered(self, request_id: int, result: HostResult) -> None:
        if self._cells.wait_answered(request_id, result):
            return
        pending = self.pending.pop(request_id, None)
        if pending is None:
            raise RemoteProtocolError(f"code-mode host returned unknown request ID {request_id}")
        # A match, not a dict of handlers: building one per response hashed six enum members
        # (a Python-level `__hash__` each).
        match pending.kind:
            case Kind.EXECUTE | Kind.EXECUTE_TO_PENDING:  # every cell's: first
                self._on_started(request_id, pending, result)
            case Kind.OPEN:
                self._on_opened(request_id, pending, result)
            case Kind.TERMINATE:
                self._on_terminated(request_id, pending, result)
            case Kind.SHUTDOWN:
                self._on_session_closed(request_id, pending, result)
            case Kind.CELLS:
                self._on_cells(request_id, pending, result)
            case Kind.USAGE:
                self._on_usage(request_id, pending, result)
            case _:
                assert_never(pending.kind)

    def _on_opened(self, request_id: int, pending: PendingOperation, result: HostResult) -> None:
        session_id = pending.session_id
        if isinstance(result, Err):
            self._sessions.move(session_id, SessionTrigger.REFUSED)
        elif not isinstance(result.value, SessionReady) or result.value.session_id != session_id:
            raise RemoteProtocolError("code-mode host returned an invalid open-session response")
        else:
            self._sessions.move(session_id, SessionTrigger.READY)
            if pending.abandoned:
                # Its caller went away: nobody will ever use or shut down this session.
                self.shut_down(session_id, internal=True)
        self._events.append(Answered(request_id=request_id, result=result))

    def _on_started(self, request_id: int, pending: PendingOperation, result: HostResult) -> None:
        if not isinstance(result, Ok):  # the common class first: a failed check costs more
            self._events.append(Answered(request_id=request_id, result=result))
            return
        if not isinstance(result.value, ExecutionStarted):
            raise RemoteProtocolError("code-mode host returned an invalid execute response")
        frontier = pending.kind is Kind.EXECUTE_TO_PENDING
        self._cells.admit(pending.session_id, result.value.cell_id, request_id, frontier=frontier)
        if pending.abandoned:
            # The caller never learned the cell id: the cell must not run unobserved forever
            # (design.md, design 4, the cancellation rule). Its initial observation was
            # cancelled with it.
            self.abandon_cell(request_id, pending.session_id, result.value.cell_id, cancelled=True)
        # Also when abandoned: the adapter still owes the cell its delegate and `cell_closed`.
        self._events.append(Answered(request_id=request_id, result=result))

    def abandon_cell(
        self, request_id: int, session_id: str, cell_id: str, *, cancelled: bool
    ) -> None:
        """Terminate a cell whose caller never learned its id; its initial observation is
        retired (`cancelled`: its execute's `operation/cancel` was sent already)."""
        self._cells.release_initial(request_id, cancel=not cancelled)
        terminating = self.new_id()
        if not self._cells.terminate_now(terminating, session_id, cell_id):
            terminate = Terminate(session_id=session_id, cell_id=cell_id)
            self.request(Kind.TERMINATE, terminate, internal=True, request_id=terminating)

    def _on_terminated(
        self, request_id: int, pending: PendingOperation, result: HostResult
    ) -> None:
        result = self._cells.terminated(request_id, pending.session_id, pending.cell_id, result)
        if not pending.internal:
            self._events.append(Answered(request_id=request_id, result=result))

    def _on_session_closed(
        self, request_id: int, pending: PendingOperation, result: HostResult
    ) -> None:
        session_id = pending.session_id
        if isinstance(result, Ok) and (
            not isinstance(result.value, SessionClosed) or result.value.session_id != session_id
        ):
            raise RemoteProtocolError("code-mode host returned an invalid shutdown response")
        if session_id in self._sessions:
            self._sessions.move(session_id, SessionTrigger.CLOSED)
        self._cells.forget_session(session_id)
        if not pending.internal:
            self._events.append(Answered(request_id=request_id, result=result))

    def _on_cells(self, request_id: int, pending: PendingOperation, result: HostResult) -> None:
        if isinstance(result, Ok) and not isinstance(result.value, CellList):
            raise RemoteProtocolError("code-mode host returned an invalid cell list response")
        self._events.append(Answered(request_id=request_id, result=result))

    def _on_usage(self, request_id: int, pending: PendingOperation, result: HostResult) -> None:
        if isinstance(result, Ok) and not isinstance(result.value, UsageReport):
            raise RemoteProtocolError("code-mode host returned an invalid usage response")
        self._events.append(Answered(request_id=request_id, result=result))

    def new_id(self) -> int:
        request_id = self._next
        self._next += 1
        return request_id

    def request(
        self,
        kind: Kind,
        request: HostRequest,
        *,
        internal: bool = False,
        request_id: int | None = None,
    ) -> int:
        request_id = self.new_id() if request_id is None else request_id
        cell_id = request.cell_id if type(request) is _TERMINATE else ""
        pending = PendingOperation(kind, request.session_id, cell_id, internal=internal)
        try:
            self._queue(OperationRequest(id=request_id, request=request))
        except (
            FrameTooLargeError,
            TypeError,
            ValueError,
            OverflowError,
            msgspec.EncodeError,
        ) as error:
            if kind is Kind.OPEN:
                self._sessions.forget(pending.session_id)
            if isinstance(error, FrameTooLargeError):
                raise
            # A value the sessions' checks leave to the encoder (a schema's contents): the
            # application's mistake, named as such, and nothing was queued.
            raise InvalidRequestError(f"invalid code-mode request: {error}") from None
        self.pending[request_id] = pending
        return request_id

    def shut_down(self, session_id: str, *, internal: bool = False) -> int:
        """Queue `session/shutdown` (a second one goes too: the host answers it)."""
        if self._sessions.get(session_id) is SessionState.OPEN:
            self._sessions.move(session_id, SessionTrigger.SHUTDOWN)
        request = ShutdownSession(session_id=session_id)
        return self.request(Kind.SHUTDOWN, request, internal=internal)
