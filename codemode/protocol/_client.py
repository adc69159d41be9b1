"""The client side of the wire as a sans-IO state machine (h11's `Connection`; design.md, style 3).

`ClientConnection` turns calls into frames (`data_to_send()`) and received bytes
(`receive_data()`) into events (`next_event()`). It does no I/O and knows nothing of trio: the
process provider's adapter moves the bytes and runs the tasks.

What it owns:
1. The handshake: the hello is queued at construction; no operation before `connection/ready`.
2. The request book: ids from 1, each answered once; an unknown or repeated answer, a second
   handshake response, a delegate request for an unknown cell or a repeated delegate id
   (the last 4096 are remembered) raise `RemoteProtocolError`: the connection is unusable.
3. Retirement (`cancel`): a cancelled execute that the host admits anyway gets its cell
   terminated; a cancelled observation is retired and its answer parked for the cell's next
   observer (`_cellview`); a cancelled open gets its session shut down. Nothing the host took
   from a cell is dropped.
4. Reverse calls: answered at most once, never after `delegate/cancel` or `cell/closed`; an
   answer too large for a frame becomes a `frame_limit` error for that call only.
5. Local refusals: a second observer, or a second terminate in flight, is answered at once with
   the error the host would give, without a frame.
6. Resume (`RESUME_CAPABILITY`, `_replay.py`): after a cut, `begin_resume` starts the new
   stream with `connection/resume`; until the host's answer (`ConnectionResumed`, or
   `ResumeFailed`) nothing else is sent, and operations made meanwhile are numbered and kept
   for the replay. `goodbye` says the client is closing on purpose; the host's is an event.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from .._api import (
    AdmissionLimits,
    CellLimits,
    Completed,
    ExecuteRequest,
    LiveCell,
    Pending,
    RuntimeResponse,
    Terminated,
    Yielded,
)
from ..observability._report import CellReport, TraceContext
from ._capabilities import (
    APPROVAL_CAPABILITY,
    CLOSING_INITIAL_CAPABILITY,
    RESUME_CAPABILITY,
    TRACE_CAPABILITY,
)
from ._cells import CellBook
from ._cellview import CellView
from ._connection_messages import (
    Ack,
    Goodbye,
    Ping,
    Pong,
    Ready,
    Rejected,
    Resume,
    Resumed,
    describe_rejection,
)
from ._endpoint import Endpoint
from ._errors import LocalProtocolError, RemoteProtocolError
from ._events import (
    ClientEvent,
    ClientStatistics,
    ConnectionResumed,
    HandshakeCompleted,
    HandshakeRejected,
    ResumeFailed,
    StoredValuesCommitted,
)
from ._handshake import checked_ready, client_hello
from ._messages import (
    CellClosed,
    DelegateCancel,
    DelegateRequest,
    Err,
    Execute,
    ExecuteToPending,
    ExecutionStarted,
    GetUsage,
    HostMessage,
    HostResponse,
    InitialResponse,
    ListCells,
    Ok,
    OpenSession,
    OperationCancel,
    OperationResponse,
    OperationYield,
    SessionCommitted,
    SessionReady,
    Terminate,
    ToolInvoke,
    WaitCompleted,
)
from ._operations import Kind, OperationBook
from ._reverse import DelegateResult, ReverseCalls
from ._states import ConnectionState, ConnectionTrigger, SessionBook, SessionState

HostResult = Ok[HostResponse] | Err
InitialResult = Ok[RuntimeResponse | Pending] | Err

# The frames every cell brings, matched by their exact type (`Final`: C statics in the compiled
# build). msgspec decodes a frame to exactly its class, and a failed `isinstance` against a
# msgspec class costs the compiled build about 600 instructions: a `match` took eleven
# of them for a cell's four frames (docs/compiled.md, "What a compiled module still pays for").
_OPERATION_RESPONSE: Final = OperationResponse
_INITIAL_RESPONSE: Final = InitialResponse
_DELEGATE_REQUEST: Final = DelegateRequest
_CELL_CLOSED: Final = CellClosed


class ClientConnection(Endpoint[HostMessage, ClientEvent]):
    """One client connection to a host, from hello to loss.

    Args:
        required_capabilities: capabilities the host must offer.
        optional_capabilities: capabilities the client can use when offered.
        codemode_version: sent in the hello for a host that checks it (one on a socket).
        token: the host's shared secret, sent in the hello (None: the host needs none).
    """

    def __init__(
        self,
        *,
        required_capabilities: Iterable[str] = (),
        optional_capabilities: Iterable[str] = (),
        codemode_version: str | None = None,
        token: str | None = None,
    ) -> None:
        super().__init__(HostMessage)
        self.admission: AdmissionLimits | None = None
        """The limits the host advertised in `connection/ready` (None: it did not)."""
        self._sessions = SessionBook()
        self._cells = CellBook(self._events, self._queue)  # type: ignore[arg-type]
        self._calls = ReverseCalls(self._events, self._queue, self._cells)  # type: ignore[arg-type]
        self._operations = OperationBook(self._events, self._queue, self._sessions, self._cells)
        required, optional = tuple(required_capabilities), tuple(optional_capabilities)
        self._offered = {*required, *optional}
        self._queue(client_hello(required, optional, codemode_version, token))
        self.resume_token: str | None = None
        """The secret that resumes this connection once (rule 6): never log it."""
        self.resume_grace: float | None = None
        """Seconds the host keeps this connection's sessions after a cut (None: no resume)."""
        self._resuming = False

    # ---- bytes -----------------------------------------------------------------------------

    def statistics(self) -> ClientStatistics:
        """Counts of what the connection holds (for leak checks and capacity)."""
        return ClientStatistics(
            requests=len(self._operations.pending),
            observations=len(self._cells.observations),
            cells=len(self._cells.cells),
            calls=len(self._calls),
            sessions=len(self._sessions),
        )

    def held_initials(self) -> dict[int, InitialResult]:
        """Initial responses that arrived before their `StartedCell` awaited them, by execute
        request id: they stay deliverable after the connection is lost."""
        return self._cells.held_initials()

    def connection_lost(self) -> list[tuple[str, str]]:
        """The connection is over (host gone, stream broken, protocol error): forget
        everything. Returns the (session id, cell id) of every cell not yet closed."""
        self._move(ConnectionTrigger.ENDED)
        self._events.clear()
        live = [key for key, view in self._cells.cells.items() if not view.closed]
        self._operations.pending.clear()
        self._cells.observations.clear()
        self._cells.cells.clear()
        self._calls.clear()
        self._sessions.clear()
        return live

    # ---- operations ------------------------------------------------------------------------

    def open_session(
        self,
        session_id: str,
        limits: CellLimits | None,
        *,
        store_load: bool = True,
        keep_stored_values: bool = False,
        stored_values: dict[str, bytes] | None = None,
    ) -> int:
        """Queue `session/open`; returns its request id. `keep_stored_values`: the host sends
        each commit back (`StoredValuesCommitted`); `stored_values`: what it starts with (both
        need `KEPT_VALUES_CAPABILITY`)."""
        self._check_usable()
        if session_id in self._sessions:
            raise LocalProtocolError(f"code-mode session {session_id} is already open")
        self._sessions.opening(session_id)
        request = OpenSession(
            session_id=session_id,
            cell_execution_limits=limits,
            store_load=store_load,
            keep_stored_values=keep_stored_values,
            stored_values=stored_values,
        )
        return self._operations.request(Kind.OPEN, request)

    def execute(
        self,
        session_id: str,
        request: ExecuteRequest,
        *,
        to_pending: bool = False,
        trace: TraceContext | None = None,
    ) -> int:
        """Queue `session/execute` (`to_pending`: `session/executeToPending`); its answer, then
        the cell's initial response, follow. `trace` goes with it if the host takes it.

        Raises:
            FrameTooLargeError: the request does not fit in a frame; nothing was queued.
        """
        self._check_session(session_id)
        trace = self._traceable(trace)
        if to_pending:
            frontier = ExecuteToPending(session_id=session_id, request=request, trace=trace)
            return self._operations.request(Kind.EXECUTE_TO_PENDING, frontier)
        execute = Execute(session_id=session_id, request=request, trace=trace)
        return self._operations.request(Kind.EXECUTE, execute)

    def _traceable(self, trace: TraceContext | None) -> TraceContext | None:
        """`trace` if the host negotiated the trace context (the capability rule), else None."""
        return trace if trace is not None and TRACE_CAPABILITY in self.capabilities else None

    def take_initial(self, request_id: int) -> None:
        """The `StartedCell` of execute `request_id` now awaits its initial response."""
        self._cells.take_initial(request_id)

    def release_initial(self, request_id: int) -> None:
        """The `StartedCell` of execute `request_id` gives its initial observation up: the
        cell's next `wait` may observe, and gets what that observation took."""
        if not self._closed:
            self._cells.release_initial(request_id)

    def wait(
        self,
        session_id: str,
        cell_id: str,
        yield_time_ms: int | None,
        *,
        trace: TraceContext | None = None,
    ) -> int:
        """Queue an observation of the cell (`yield_time_ms` None: to its pending frontier),
        or answer it from parked output, or defer it behind a retired observation; returns
        its request id. `trace` goes with it if the host takes it."""
        self._check_session(session_id)
        request_id = self._operations.new_id()
        frontier = yield_time_ms is None
        window = 0 if yield_time_ms is None else yield_time_ms
        trace = self._traceable(trace)
        self._cells.observe(request_id, session_id, cell_id, window, frontier=frontier, trace=trace)
        return request_id

    def preempt(self, session_id: str, cell_id: str) -> None:
        """Queue `operation/yield` for the cell's plain observation, if the host serves one."""
        self._check_session(session_id)
        request_id = self._cells.observing(session_id, cell_id)
        if request_id is not None:
            self._queue(OperationYield(id=request_id))

    def abandon(self, request_id: int, session_id: str, cell_id: str) -> None:
        """The caller of execute `request_id` went away after the cell started, before it
        returned the cell's id: terminate the cell (design.md, design 4, the cancellation rule)."""
        if not self._closed:
            self._operations.abandon_cell(request_id, session_id, cell_id, cancelled=True)

    def terminate(self, session_id: str, cell_id: str) -> int:
        """Queue `session/terminate` (or answer it from a parked completion, or refuse a
        second one)."""
        self._check_session(session_id)
        request_id = self._operations.new_id()
        if not self._cells.terminate_now(request_id, session_id, cell_id):
            terminate = Terminate(session_id=session_id, cell_id=cell_id)
            self._operations.request(Kind.TERMINATE, terminate, request_id=request_id)
        return request_id

    def shutdown_session(self, session_id: str) -> int:
        """Queue `session/shutdown`; every `cell/closed` of the session precedes its answer."""
        self._check_session(session_id)
        return self._operations.shut_down(session_id)

    def cells(self, session_id: str) -> int:
        """Queue `session/cells`: the session's live cells, answered with a `CellList`."""
        self._check_session(session_id)
        return self._operations.request(Kind.CELLS, ListCells(session_id=session_id))

    def usage(self, session_id: str) -> int:
        """Queue `session/usage`: what the session used of its budgets, answered with a
        `UsageReport`."""
        self._check_session(session_id)
        return self._operations.request(Kind.USAGE, GetUsage(session_id=session_id))

    def cancel(self, request_id: int) -> None:
        """The caller of `request_id` went away (rule 3). Unknown or answered ids are ignored;
        a terminate or a shutdown still runs to its end. The answer of an abandoned execute,
        open, terminate or shutdown is still an event (nobody may be waiting for it)."""
        if self._closed:
            return
        pending = self._operations.pending.get(request_id)
        if pending is not None:
            pending.abandoned = True
            if pending.kind in (Kind.EXECUTE, Kind.EXECUTE_TO_PENDING):
                self._queue(OperationCancel(id=request_id))
            return
        self._cells.retire(request_id)

    def undelivered(
        self, request_id: int, session_id: str, result: HostResult | InitialResult
    ) -> None:
        """An answer this connection emitted never reached its caller (cancelled after the
        answer arrived, before it ran): take it back so nothing is lost (rule 3). A started
        cell is terminated (its caller never learned its id), an observation's output is
        parked for the cell's next observer, an opened session is shut down."""
        if self._closed or isinstance(result, Err):
            return
        value = result.value
        if isinstance(value, ExecutionStarted):
            self._operations.abandon_cell(request_id, session_id, value.cell_id, cancelled=False)
        elif isinstance(value, SessionReady):
            self._operations.shut_down(session_id, internal=True)
        elif isinstance(value, WaitCompleted):
            if isinstance(value.outcome, LiveCell):
                self._cells.take_back(session_id, value.outcome.response)
        elif isinstance(value, Yielded | Completed | Terminated | Pending):
            self._cells.take_back(session_id, value)

    def send_approval_waiting(self, call_id: int, waiting: bool) -> bool:
        """Tell the host that reverse call `call_id` started or stopped waiting for approval
        (only with `APPROVAL_CAPABILITY`); False (nothing queued) otherwise, or if the host no
        longer wants the call."""
        if self._closed or APPROVAL_CAPABILITY not in self.capabilities:
            return False
        return self._calls.waiting(call_id, waiting)

    def send_delegate_response(self, call_id: int, result: DelegateResult) -> bool:
        """Answer reverse call `call_id`; False (nothing queued) if the host no longer wants
        it. An answer too large for a frame is replaced by a `frame_limit` error.

        Raises:
            TypeError, ValueError, msgspec.EncodeError: the result has no msgpack form; the
                call stays open for another answer.
        """
        return not self._closed and self._calls.respond(call_id, result)

    # ---- incoming --------------------------------------------------------------------------

    def _receive(self, message: HostMessage) -> None:
        if self._handshaking:
            self._receive_handshake(message)
            return
        if self._resuming:
            self._receive_resumed(message)
            return
        if type(message) is _OPERATION_RESPONSE:
            self._operations.answered(message.id, message.result)
        elif type(message) is _DELEGATE_REQUEST:
            self._on_delegate_request(message)
        elif type(message) is _INITIAL_RESPONSE:
            if message.closed:
                self._on_closing_initial(message)
            else:
                self._cells.initial_answered(message.id, message.result)
        elif type(message) is _CELL_CLOSED:
            self._on_cell_closed(message.session_id, message.cell_id, message.report)
        else:
            self._receive_other(message)

    def _receive_other(self, message: HostMessage) -> None:
        """The frames `_receive` does not match by their exact type (the decoder makes no
        other, so the four it does match cannot come here)."""
        match message:
            case DelegateCancel(id=call_id):
                self._calls.cancelled(call_id)
            case SessionCommitted(session_id=session_id, values=values):
                if session_id not in self._sessions:
                    raise RemoteProtocolError(
                        f"code-mode host sent commits of unknown session {session_id}"
                    )
                self._events.append(StoredValuesCommitted(session_id=session_id, values=values))
            case Ready() | Rejected():
                raise RemoteProtocolError("code-mode host sent a second handshake response")
            case Ping() | Pong():
                self._heartbeat(message)
            case Ack():
                self._acknowledged(message)
            case Goodbye():
                self._said_goodbye()
            case Resumed():
                raise RemoteProtocolError("code-mode host sent connection/resumed unasked")

    def _receive_handshake(self, message: HostMessage) -> None:
        if isinstance(message, Rejected):
            self._move(ConnectionTrigger.REFUSED)
            self._events.append(HandshakeRejected(reason=message.reason))
            return
        ready = checked_ready(message, self._offered)
        self._move(ConnectionTrigger.READY)
        self.capabilities = frozenset(ready.capabilities)
        self.admission = ready.admission
        if RESUME_CAPABILITY in self.capabilities:
            if ready.resume_token is None or ready.resume_grace_ms is None:
                raise RemoteProtocolError("code-mode host selected resume without a token")
            self.resume_token = ready.resume_token
            self.resume_grace = ready.resume_grace_ms / 1000
            self._start_replay()
        self._events.append(HandshakeCompleted(capabilities=self.capabilities))

    # ---- resume (rule 6) -------------------------------------------------------------------

    def begin_resume(self) -> None:
        """The stream was cut: queue `connection/resume` for the next one (call `suspend`
        first, when the cut is noticed; operations may be made in between)."""
        assert self._replay is not None
        assert self.resume_token is not None
        self._resuming = True
        self._outgoing = bytearray()  # a resume attempt before may have queued one
        resume = Resume(token=self.resume_token, received=self._replay.received)
        self._encoder.encode_into(resume, self._outgoing)

    def _receive_resumed(self, message: HostMessage) -> None:
        replay = self._replay
        assert replay is not None
        if isinstance(message, Rejected):
            self._events.append(ResumeFailed(reason=describe_rejection(message.reason)))
            return
        if not isinstance(message, Resumed):
            raise RemoteProtocolError(
                f"code-mode host answered a resume with {type(message).__name__}"
            )
        if not replay.can_replay_to(message.received):
            raise RemoteProtocolError(
                f"code-mode host resumed having received {message.received} frames;"
                f" {replay.sent} were sent"
            )
        self._resuming = False
        self.resume_token = message.token
        replay.replay(message.received, self._outgoing)
        self._events.append(ConnectionResumed())

    def _on_delegate_request(self, message: DelegateRequest) -> None:
        request = message.request
        cell_id = request.invocation.cell_id if isinstance(request, ToolInvoke) else request.cell_id
        self._calls.requested(
            message, self._live_view(message.session_id, cell_id, "delegated for")
        )

    def _on_closing_initial(self, message: InitialResponse) -> None:
        """An initial response that closes its cell too: the answer, then what `cell/closed`
        does (`CLOSING_INITIAL_CAPABILITY`)."""
        if CLOSING_INITIAL_CAPABILITY not in self.capabilities:
            raise RemoteProtocolError(
                "code-mode host closed a cell in its initial response without the"
                f" `{CLOSING_INITIAL_CAPABILITY}` capability"
            )
        self._close_view(self._cells.initial_closing(message.id, message.result), message.report)

    def _on_cell_closed(self, session_id: str, cell_id: str, report: CellReport | None) -> None:
        self._close_view(self._live_view(session_id, cell_id, "closed"), report)

    def _close_view(self, view: CellView, report: CellReport | None) -> None:
        self._calls.cell_closed(view)
        self._cells.close(view, report)

    def _live_view(self, session_id: str, cell_id: str, what: str) -> CellView:
        """The view of a live cell the host names, or a `RemoteProtocolError`."""
        if session_id not in self._sessions:
            raise RemoteProtocolError(
                f"code-mode host {what} a cell of unknown session {session_id}"
            )
        view = self._cells.live(session_id, cell_id)
        if view is None:
            raise RemoteProtocolError(
                f"code-mode host {what} unknown cell {cell_id} in session {session_id}"
            )
        return view

    # ---- checks ----------------------------------------------------------------------------

    def _check_usable(self) -> None:
        if self._open and not self._handshaking:
            return
        self._check_not_failed()
        if self._state is ConnectionState.CLOSED:
            raise LocalProtocolError("the code-mode host connection is closed")
        if self._state is ConnectionState.HANDSHAKING:
            raise LocalProtocolError("the code-mode handshake has not completed")

    def _check_session(self, session_id: str) -> None:
        self._check_usable()
        state = self._sessions.get(session_id)
        if state is not SessionState.OPEN and state is not SessionState.CLOSING:
            raise LocalProtocolError(f"unknown code-mode session {session_id}")
