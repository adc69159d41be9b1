"""The host side of the wire as a sans-IO state machine (h11's `Connection`; design.md, style 3).

`HostConnection` turns received bytes into events for the host program (`next_event()`) and
its answers into frames (`data_to_send()`). It does no I/O and knows nothing of trio or of the
runtime: `codemode_host.server` moves the bytes and runs the requests.

What it owns (design.md, host 3, 4.1 and 5):
1. The handshake: the first frame must be a hello (else `invalidHello`); versions and
   capabilities are negotiated; a hello that does not decode is a `RemoteProtocolError`.
2. The request book: a request id is active until answered (an execute until its initial
   response); a repeated active id, or one of the last 4096 finished ids, is fatal.
3. The session book: ids open, opening or closing, and the last 4096 closed ones; requests for
   an unknown or closing session, a reused id, limits or frontier requests without their
   capability, are answered here and never reach the runtime; an `operation/yield` without its
   capability is a `RemoteProtocolError`.
4. Per-cell order: `execution/started`, then reverse calls and the initial response, then
   `cell/closed`, which is held back until the initial response is queued (with
   `CLOSING_INITIAL_CAPABILITY`, a cell closed by then is closed by its initial response
   instead); no reverse call after `cell/closed`; `session/closed` is held back until every
   cell of the session closed.
5. Reverse calls: ids from 1; `delegate/cancel` only for a call still pending, at most once;
   an answer to an unknown or cancelled call is ignored.
6. Frame limits: an answer too large for a frame is replaced by a `frame_limit` error with the
   same id; a reverse call too large fails that call only (`FrameTooLargeError` to the caller).
7. Admission: at most `max_requests_in_flight` requests are active at once; one past it is
   answered at once with an `admission` error (`code-mode host has too many in-flight
   requests`) and never reaches the runtime. `connection/ready` advertises the limits.
8. Who may connect (a host on a socket): with a `token`, a hello whose token is missing or
   differs (compared in constant time) is refused with `Unauthorized`, whose text never holds
   a token; then, with a `codemode_version`, a hello naming another version (or none) is
   refused with `VersionMismatch`. Both are checked before versions and capabilities.
9. A frame that does not decode: before the handshake it ends the connection. After it, an
   `operation/request` whose body does not decode is answered with an `invalid_request` error
   for its id, and a `delegate/response` whose body does not decode fails that tool call
   (`_salvage`); anything else (an unknown type, no usable id, a broken length prefix, not
   msgpack at all) is fatal. A deliberate deviation from the reference, whose host exits on
   any undecodable frame: one application's bad request must not cost the other sessions of a
   shared host their cells (docs/protocol.md).
10. The connection's state and each session's go through `_states.CONNECTION` and
   `_states.SESSION`; after a protocol error every call raises `LocalProtocolError`.
11. Resume (`_replay.py`): a new stream's `connection/resume` is an event (`ResumeRequested`)
   the adapter answers on the connection its token names (`resume`) or here (`refuse_resume`).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from typing import Final

import msgspec

from .._api import AdmissionLimits, Pending, RuntimeResponse
from ..errors import TOO_MANY_REQUESTS, ErrorKind
from ..observability._report import CellReport
from ._capabilities import (
    APPROVAL_CAPABILITY,
    CAPABILITIES,
    CLOSING_INITIAL_CAPABILITY,
    PROTOCOL_VERSION,
    RESUME_CAPABILITY,
    TRACE_CAPABILITY,
    YIELD_CAPABILITY,
)
from ._codec import FrameDecodeError, FrameTooLargeError
from ._connection_messages import (
    Ack,
    Goodbye,
    Hello,
    InvalidHello,
    Ping,
    Pong,
    Ready,
    Rejected,
    RejectReason,
    Resume,
    Resumed,
    ResumeRefused,
)
from ._endpoint import Endpoint
from ._errors import LocalProtocolError, RemoteProtocolError
from ._events import (
    ApprovalWaiting,
    CancelRequested,
    DelegateAnswered,
    HandshakeCompleted,
    HandshakeRejected,
    HostEvent,
    HostStatistics,
    PreemptRequested,
    RequestReceived,
    ResumeRequested,
)
from ._handshake import answer_hello
from ._messages import (
    CellClosed,
    ClientMessage,
    DelegateCancel,
    DelegateRequest,
    DelegateResponse,
    DelegateWaiting,
    Err,
    Execute,
    ExecuteToPending,
    ExecutionStarted,
    HostRequest,
    HostResponse,
    InitialResponse,
    NotificationSend,
    Ok,
    OpenSession,
    OperationCancel,
    OperationRequest,
    OperationResponse,
    OperationYield,
    SessionClosed,
    SessionCommitted,
    SessionReady,
    ShutdownSession,
    ToolInvoke,
    Wait,
    WaitToPending,
)
from ._recent import RecentIds, RecentNumbers
from ._refusals import invalid, refusal
from ._routes import Route, started_by
from ._salvage import salvage
from ._states import ConnectionState, ConnectionTrigger, SessionBook, SessionTrigger

# Compared with a frame's or a request's exact class (the decoder makes no other; C statics
# compiled): a failed `isinstance` against a msgspec class costs about 600 instructions
# compiled, and every execute and every delegate answer failed several.
_OPERATION_REQUEST: Final = OperationRequest
_DELEGATE_RESPONSE: Final = DelegateResponse
_OPEN_SESSION: Final = OpenSession
_SHUTDOWN_SESSION: Final = ShutdownSession


class HostConnection(Endpoint[ClientMessage, HostEvent]):
    """One client connection, as the host serves it.

    Args:
        supported_capabilities: what this host can offer in the handshake.
        admission: the limits the host applies, advertised in `connection/ready`; this
            connection enforces `max_requests_in_flight` (rule 7), the runtime the others.
        token: the shared secret a hello must carry (None: none is required; rule 8).
        codemode_version: the version a hello must name (None: not checked; rule 8).
        resume_grace: seconds a cut connection's sessions are kept for a resume, advertised
            with `RESUME_CAPABILITY` (rule 11).
    """

    def __init__(
        self,
        *,
        supported_capabilities: Iterable[str] = CAPABILITIES,
        admission: AdmissionLimits | None = None,
        token: str | None = None,
        codemode_version: str | None = None,
        resume_grace: float = 30.0,
    ) -> None:
        self._supported = frozenset(supported_capabilities)
        self._resume_grace_ms = round(resume_grace * 1000)
        self.resume_token: str | None = None
        """The secret that resumes this connection once (rule 11): never log it."""
        self._token = token
        self._codemode_version = codemode_version
        self.admission = admission or AdmissionLimits()
        super().__init__(ClientMessage)
        self._active: dict[int, HostRequest] = {}
        self._finished = RecentNumbers()
        self._sessions = SessionBook()
        self._closed_sessions = RecentIds()
        self._routes: dict[tuple[str, str], Route] = {}
        self._routes_of: dict[str, set[Route]] = {}
        self._held_closes: dict[str, int] = {}
        self._calls: dict[int, Route] = {}
        self._next_call = 1

    # ---- bytes -----------------------------------------------------------------------------

    def statistics(self) -> HostStatistics:
        """Counts of what the connection holds (for leak checks and admission)."""
        return HostStatistics(
            requests=len(self._active),
            sessions=len(self._sessions),
            routes=len(self._routes),
            calls=len(self._calls),
        )

    # ---- answers ---------------------------------------------------------------------------

    def respond(self, request_id: int, result: Ok[HostResponse] | Err) -> None:
        """Queue the `operation/response` of active request `request_id`.

        An `ExecutionStarted` keeps the request active until `respond_initial`. A
        `SessionClosed` is held back until every cell of the session is closed.
        """
        if self._failed:
            self._check_not_failed()
        request = self._active.get(request_id)
        if request is None:
            raise LocalProtocolError(f"code-mode request {request_id} is not active")
        value = result.value if isinstance(result, Ok) else None
        match request:
            case Execute() if isinstance(value, ExecutionStarted):
                self._start_route(request_id, request.session_id, value.cell_id)
                return  # active until its initial response
            case OpenSession(session_id=session_id):
                if isinstance(value, SessionReady):
                    self._sessions.move(session_id, SessionTrigger.READY)
                    self._routes_of[session_id] = set()
                else:
                    self._sessions.move(session_id, SessionTrigger.REFUSED)
            case ShutdownSession(session_id=session_id) if isinstance(value, SessionClosed):
                if self._routes_of.get(session_id):
                    self._held_closes[session_id] = request_id
                    return
                self._forget_session(session_id)
        self._finish(request_id)
        self._send_response(request_id, result)

    def respond_initial(self, request_id: int, result: Ok[RuntimeResponse | Pending] | Err) -> None:
        """Queue the initial response of the cell started by execute `request_id`, then its
        `cell/closed` if the cell already closed."""
        if self._failed:
            self._check_not_failed()
        route = self._route_of_execute(request_id)
        if route is None or route.initial_sent:
            raise LocalProtocolError(f"code-mode execute {request_id} has no initial response due")
        # A cell that closed already is closed by this frame (no `cell/closed` follows) when
        # the client can read it so: one frame fewer for most cells.
        closing = route.closed and CLOSING_INITIAL_CAPABILITY in self.capabilities
        report = route.report if closing else None
        frame = InitialResponse(id=request_id, result=result, closed=closing, report=report)
        try:
            self._queue(frame)
        except FrameTooLargeError as error:
            text = f"code-mode initial response exceeds the IPC frame limit: {error}"
            self._queue(msgspec.structs.replace(frame, result=_err(ErrorKind.FRAME_LIMIT, text)))
        route.initial_sent = True
        self._finish(request_id)
        if closing:
            self._forget_route(route)
        elif route.closed:
            self._close_route(route)

    def committed(self, session_id: str, values: dict[str, bytes]) -> None:
        """Queue `session/committed`: what a cell of a session that keeps its stored values
        committed (before the cell's completion reaches the client)."""
        self._check_not_failed()
        self._queue(SessionCommitted(session_id=session_id, values=values))

    def cell_closed(self, session_id: str, cell_id: str, report: CellReport | None = None) -> None:
        """The runtime closed the cell: queue `cell/closed` (after its initial response), with
        the cell's `report` if the client negotiated the trace context."""
        if self._failed:
            self._check_not_failed()
        route = self._routes.get((session_id, cell_id))
        if route is None or route.closed:
            raise LocalProtocolError(f"code-mode cell {cell_id} of {session_id} is not open")
        route.closed = True
        if TRACE_CAPABILITY in self.capabilities:
            route.report = report
        for call_id in route.calls:
            del self._calls[call_id]  # the runtime cancelled them: no cancel frame is owed
        route.calls.clear()
        if route.initial_sent:
            self._close_route(route)

    # ---- reverse calls ---------------------------------------------------------------------

    def call_client(
        self, session_id: str, cell_id: str, request: ToolInvoke | NotificationSend
    ) -> int:
        """Queue a reverse call for a live cell; returns its delegate id.

        Raises:
            FrameTooLargeError: the call does not fit in a frame (fail this call only).
            LocalProtocolError: the cell is closed or unknown.
        """
        if self._failed:
            self._check_not_failed()
        route = self._routes.get((session_id, cell_id))
        if route is None or route.closed or self._closed:
            raise LocalProtocolError("code-mode cell is closed")
        call_id = self._next_call
        self._queue(DelegateRequest(id=call_id, session_id=session_id, request=request))
        self._next_call += 1
        self._calls[call_id] = route
        route.calls.add(call_id)
        return call_id

    def cancel_call(self, call_id: int) -> None:
        """The host no longer wants reverse call `call_id` answered: `delegate/cancel` if it
        is still pending (at most once)."""
        route = self._calls.pop(call_id, None)
        if route is not None:
            route.calls.discard(call_id)
            if not self._closed:
                self._queue(DelegateCancel(id=call_id))

    # ---- incoming --------------------------------------------------------------------------

    def _receive(self, message: ClientMessage) -> None:
        if self._handshaking:
            self._handshake(message)
            return
        if type(message) is _OPERATION_REQUEST:
            self._on_request(message.id, message.request)
        elif type(message) is _DELEGATE_RESPONSE:
            call_id = message.id
            route = self._calls.pop(call_id, None)
            if route is not None:  # unknown and cancelled ids are ignored
                route.calls.discard(call_id)
                self._events.append(DelegateAnswered(call_id=call_id, result=message.result))
        else:
            self._receive_other(message)

    def _receive_other(self, message: ClientMessage) -> None:
        """The frames `_receive` does not match by their exact class."""
        match message:
            case OperationCancel(id=request_id):
                if isinstance(self._active.get(request_id), Execute | Wait | WaitToPending):
                    self._events.append(CancelRequested(request_id=request_id))
            case OperationYield(id=request_id):
                if YIELD_CAPABILITY not in self.capabilities:
                    raise RemoteProtocolError(
                        f"operation/yield without the `{YIELD_CAPABILITY}` capability"
                    )
                active = self._active.get(request_id)
                if isinstance(active, Wait) or (
                    isinstance(active, Execute) and not isinstance(active, ExecuteToPending)
                ):
                    self._events.append(PreemptRequested(request_id=request_id))
            case DelegateWaiting(id=call_id, waiting=waiting):
                if APPROVAL_CAPABILITY not in self.capabilities:
                    raise RemoteProtocolError(
                        f"delegate/waiting without the `{APPROVAL_CAPABILITY}` capability"
                    )
                if call_id in self._calls:  # an answered or cancelled call's is ignored
                    self._events.append(ApprovalWaiting(call_id=call_id, waiting=waiting))
            case Hello() | Resume():
                raise RemoteProtocolError("received a second code-mode client hello")
            case Ping() | Pong():
                self._heartbeat(message)
            case Ack():
                self._acknowledged(message)
            case Goodbye():
                self._said_goodbye()

    def _undecodable(self, error: FrameDecodeError) -> None:
        """Rule 9: after the handshake, a request or a delegate answer whose body does not
        decode fails that request or that call; anything else is fatal."""
        salvaged = None if self._state is ConnectionState.HANDSHAKING else salvage(error.payload)
        if salvaged is None:
            raise error
        kind, message_id = salvaged
        text = f"invalid code-mode request: {error.problem}"
        if kind == "operation/request":
            if message_id in self._active or message_id in self._finished:
                raise RemoteProtocolError(f"duplicate code-mode request ID {message_id}")
            self._finished.add(message_id)
            self._send_response(message_id, invalid(text))
            return
        route = self._calls.pop(message_id, None)
        if route is not None:  # unknown and cancelled ids are ignored, as for a valid answer
            route.calls.discard(message_id)
            text = f"code-mode delegate response did not decode: {error.problem}"
            self._events.append(DelegateAnswered(call_id=message_id, result=invalid(text)))

    def _handshake(self, message: ClientMessage) -> None:
        if isinstance(message, Resume):
            self._events.append(ResumeRequested(token=message.token, received=message.received))
            return
        if not isinstance(message, Hello):
            self._reject(InvalidHello(message="first message must be connection/hello"))
            return
        offered = answer_hello(message, self._supported, self._token, self._codemode_version)
        if not isinstance(offered, frozenset):
            self._reject(offered)
            return
        self._move(ConnectionTrigger.READY)
        self.capabilities = offered
        resumable = RESUME_CAPABILITY in offered
        if resumable:
            self.resume_token = secrets.token_urlsafe(32)
        self._queue(
            Ready(
                selected_version=PROTOCOL_VERSION,
                capabilities=sorted(offered),
                admission=self.admission,
                resume_token=self.resume_token,
                resume_grace_ms=self._resume_grace_ms if resumable else None,
            )
        )
        if resumable:
            self._start_replay()
        self._events.append(HandshakeCompleted(capabilities=offered))

    # ---- resume (rule 11) ------------------------------------------------------------------

    def resume(self, received: int) -> bool:
        """Continue this suspended connection on a new stream whose client received
        `received` frames: queue `connection/resumed` (with the next token; the one presented
        is spent) and every frame the client did not receive. False (nothing queued): the
        count does not match what this side kept."""
        replay = self._replay
        if replay is None or not replay.can_replay_to(received):
            return False
        self.resume_token = secrets.token_urlsafe(32)
        resumed = Resumed(received=replay.received, token=self.resume_token)
        self._encoder.encode_into(resumed, self._outgoing)
        replay.replay(received, self._outgoing)
        return True

    def refuse_resume(self, message: str) -> None:
        """Refuse the resume this new connection asked for (`ResumeRequested`); it ends."""
        self._reject(ResumeRefused(message=message))

    def _reject(self, reason: RejectReason) -> None:
        self._queue(Rejected(reason=reason))
        self._move(ConnectionTrigger.REFUSED)
        self._events.append(HandshakeRejected(reason=reason))

    def _on_request(self, request_id: int, request: HostRequest) -> None:
        if request_id in self._active or request_id in self._finished:
            raise RemoteProtocolError(f"duplicate code-mode request ID {request_id}")
        self._active[request_id] = request
        kind = type(request)
        opening = kind is _OPEN_SESSION
        state = self._sessions.get(request.session_id)
        problem = refusal(request, opening, state, self._closed_sessions, self.capabilities)
        if problem is None and len(self._active) > self.admission.max_requests_in_flight:
            problem = _err(ErrorKind.ADMISSION, TOO_MANY_REQUESTS)
        if problem is not None:
            self._finish(request_id)
            self._send_response(request_id, problem)
            return
        if opening:
            self._sessions.opening(request.session_id)
        elif kind is _SHUTDOWN_SESSION:
            self._sessions.move(request.session_id, SessionTrigger.SHUTDOWN)
        self._events.append(RequestReceived(request_id=request_id, request=request))

    # ---- helpers ---------------------------------------------------------------------------

    def _send_response(self, request_id: int, result: Ok[HostResponse] | Err) -> None:
        try:
            self._queue(OperationResponse(id=request_id, result=result))
        except FrameTooLargeError as error:
            text = f"code-mode host response exceeds the IPC frame limit: {error}"
            self._queue(OperationResponse(id=request_id, result=_err(ErrorKind.FRAME_LIMIT, text)))

    def _finish(self, request_id: int) -> None:
        del self._active[request_id]
        self._finished.add(request_id)

    def _start_route(self, request_id: int, session_id: str, cell_id: str) -> None:
        key = (session_id, cell_id)
        if key in self._routes:
            raise LocalProtocolError(f"code-mode cell {cell_id} of {session_id} is already open")
        route = Route(session_id, cell_id, request_id)
        self._routes[key] = route
        self._routes_of[session_id].add(route)
        self._send_response(request_id, Ok(value=ExecutionStarted(cell_id=cell_id)))

    def _route_of_execute(self, request_id: int) -> Route | None:
        """The route of the cell that active execute `request_id` started, or None."""
        request = self._active.get(request_id)
        if not isinstance(request, Execute):
            return None
        return started_by(self._routes_of.get(request.session_id, ()), request_id)

    def _close_route(self, route: Route) -> None:
        closed = CellClosed(session_id=route.session_id, cell_id=route.cell_id, report=route.report)
        self._queue(closed)
        self._forget_route(route)

    def _forget_route(self, route: Route) -> None:
        """The client was told the cell closed: a `session/closed` held for it may go."""
        del self._routes[(route.session_id, route.cell_id)]
        routes = self._routes_of[route.session_id]
        routes.discard(route)
        held = self._held_closes.get(route.session_id)
        if held is not None and not routes:
            del self._held_closes[route.session_id]
            self._forget_session(route.session_id)
            self._finish(held)
            self._send_response(held, Ok(value=SessionClosed(session_id=route.session_id)))

    def _forget_session(self, session_id: str) -> None:
        if session_id in self._sessions:
            self._sessions.move(session_id, SessionTrigger.CLOSED)
        self._routes_of.pop(session_id, None)
        self._closed_sessions.add(session_id)


def _err(kind: ErrorKind, message: str) -> Err:
    return Err(kind=kind, message=message)
