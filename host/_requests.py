"""The host's requests and reverse calls: each operation the client asked for, run on the runtime.

Every request runs as its own task in the host's work nursery, but an execute's cell is admitted
and started as its frame is read, and its initial observation has no task until something
wakes it; when the cell's own events do (its completion, a `yield_control()`), the response is
taken and sent in the engine collector's step, after the batch of events, with no task at all;
its frame and the `cell/closed` its taking queued leave in one write.
A wait (either kind) runs inside a cancel scope that `operation/cancel` cancels (`_operation`);
an execute's cancel ends its initial observation through the runtime's hook instead, and
answers `code-mode request cancelled` (the client terminates a cell it no longer wants).
Terminate and shutdown are not cancellable. `operation/yield` preempts the cell an execute or a
wait observes.

Reverse calls: a cell's tool call or notification becomes a `delegate/request` through the
connection; when the cell cancels it, the connection sends `delegate/cancel`. A notification is
awaited in a one-shot slot by its task; a tool call has no task (the runtime's rule 6 of
`_calls`): its answer is handed to a callback. A call the connection cannot send fails in the
cell only.

Admission: every session of the connection shares one runtime `Admission` (active cells and
pending reverse calls); requests in flight are bounded by the connection itself.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Final

import trio
from codemode_host._answers import failed, timed, timed_completion
from codemode_host._operation import Operation
from codemode_host._remote_delegate import RemoteDelegate
from codemode_host.engine import Engine
from codemode_host.runtime import (
    Admission,
    CellWatch,
    ObservationCancelledError,
    Preemption,
    RuntimeCell,
    RuntimeSession,
)

from codemode import (
    AdmissionLimits,
    CellInfo,
    CellLimits,
    Pending,
    RuntimeResponse,
)
from codemode._trio import CallWorkers, OneShot
from codemode.errors import ErrorKind
from codemode.observability import (
    CellReport,
    host_observation,
)
from codemode.protocol import (
    MAX_FRAME_BYTES,
    CellList,
    Err,
    Execute,
    ExecuteToPending,
    ExecutionStarted,
    FrameTooLargeError,
    GetUsage,
    HostConnection,
    HostRequest,
    HostResponse,
    ListCells,
    LocalProtocolError,
    NotificationDelivered,
    NotificationSend,
    Ok,
    OpenSession,
    SessionClosed,
    SessionReady,
    ShutdownSession,
    Terminate,
    ToolInvoke,
    ToolResult,
    UsageReport,
    Wait,
    WaitToPending,
)

logger = logging.getLogger("codemode.host")

DelegateResult = Ok[ToolResult | NotificationDelivered] | Err

RESPONSE_BUDGET = MAX_FRAME_BYTES - (1 << 20)
"""The most output one observation takes: what fits in a frame, with room for its envelope."""

HOST_WORKERS = 64
"""Worker tasks the host keeps parked for the delegate calls it runs (notifications; its tool
calls are forwarded without a task)."""

CLIENT_GONE = "code-mode client connection closed"
CANCELLED = Err(kind=ErrorKind.CANCELLED, message="code-mode request cancelled")

# Made once and tested so that an execute matches first (C statics compiled): `A | B` builds a
# union on every call, and a failed `isinstance` against a msgspec class costs about 600
# instructions compiled (the decoder makes exactly these classes).
_OBSERVING: Final = (Execute, Wait, WaitToPending)
_EXECUTE_TO_PENDING: Final = ExecuteToPending


class Requests:
    """The host's live state for one client: runtime sessions, active requests, reverse calls.

    Args:
        engine: where cells run.
        connection: the sans-IO connection (frames are queued there).
        nursery: where requests, cells and delegate calls run (the calls by `CallWorkers`, whose
            parked workers it keeps until it is cancelled).
        flush: wakes the writer after something was queued.
        admission: the capacity the connection's sessions share (default limits if None).
    """

    def __init__(
        self,
        engine: Engine,
        connection: HostConnection,
        nursery: trio.Nursery,
        flush: Callable[[], None],
        admission: AdmissionLimits | None = None,
    ) -> None:
        self._engine = engine
        self.admission = Admission(admission)
        self._connection = connection
        self._nursery = nursery
        self._workers = CallWorkers(nursery, keep=HOST_WORKERS)
        self._watch = CellWatch(nursery)  # ends when the connection's work is cancelled
        engine.on_release(self._workers.dismiss_parked)  # rule 6 of `CallWorkers`
        self._flush = flush
        self._sessions: dict[str, RuntimeSession] = {}
        self._active: dict[int, Operation] = {}
        self._calls: dict[int, OneShot[DelegateResult]] = {}
        self._forwards: dict[int, Callable[[DelegateResult], None]] = {}
        self._tool_calls: dict[int, tuple[str, str, str]] = {}
        """Each open tool call's (session id, cell id, `tool-N`), for `approval_waiting`."""
        self._disconnected = False

    # ---- dispatch ------------------------------------------------------------------------

    def start(self, request_id: int, request: HostRequest) -> None:
        """Run a request the connection accepted, as a task (an execute's cell starts now)."""
        operation = Operation()
        if isinstance(request, _OBSERVING):
            self._active[request_id] = operation
        if isinstance(request, Execute):
            self._start_execute(request_id, request, operation)
            return
        if isinstance(request, Wait):
            operation.preemption = Preemption()
        self._nursery.start_soon(self._run, request_id, request, operation)

    def cancel(self, request_id: int) -> None:
        """`operation/cancel` of an active execute or wait."""
        operation = self._active.get(request_id)
        if operation is not None:
            operation.cancel()

    def preempt(self, request_id: int) -> None:
        """`operation/yield` of an active execute or wait: its observation yields now."""
        operation = self._active.get(request_id)
        if operation is not None and operation.preemption is not None:
            operation.preemption.request()
        elif operation is not None and operation.observed is not None:
            session_id, cell_id = operation.observed
            session = self._sessions.get(session_id)
            if session is not None:
                session.request_preempt(cell_id)

    def approval_waiting(self, call_id: int, waiting: bool) -> None:
        """`delegate/waiting`: tool call `call_id` started or stopped waiting for approval."""
        target = self._tool_calls.get(call_id)
        if target is not None:
            session_id, cell_id, runtime_id = target
            session = self._sessions.get(session_id)
            if session is not None:
                session.approval_waiting(cell_id, runtime_id, waiting)

    def answered(self, call_id: int, result: DelegateResult) -> None:
        self._tool_calls.pop(call_id, None)
        forward = self._forwards.pop(call_id, None)
        if forward is not None:
            forward(result)
            return
        slot = self._calls.get(call_id)
        if slot is not None:
            slot.set(result)

    def _respond(self, request_id: int, result: Ok[HostResponse] | Err) -> None:
        if self._disconnected:
            return  # nobody reads: the connection ended or failed
        self._connection.respond(request_id, result)
        self._flush()

    async def _run(self, request_id: int, request: HostRequest, operation: Operation) -> None:
        started = time.perf_counter()
        try:
            match request:
                case Wait(session_id=session_id, request=wait, trace=trace):
                    result: Ok[HostResponse] | Err = CANCELLED
                    with operation.scope(), host_observation(trace, "wait"):
                        outcome = await self._sessions[session_id].wait(
                            wait, preemption=operation.preemption
                        )
                        result = timed_completion(outcome, started)
                case WaitToPending(session_id=session_id, cell_id=cell_id, trace=trace):
                    result = CANCELLED
                    with operation.scope(), host_observation(trace, "wait_to_pending"):
                        outcome = await self._sessions[session_id].wait_to_pending(cell_id)
                        result = timed_completion(outcome, started)
                case OpenSession():
                    result = self._open(request)
                case Terminate(session_id=session_id, cell_id=cell_id):
                    # A pass first: every request read before this one (a wait of the same
                    # cell) takes its first step before the termination takes effect, whatever
                    # order trio runs the tasks of one batch in.
                    await trio.lowlevel.checkpoint()
                    outcome = await self._sessions[session_id].terminate(cell_id)
                    result = timed_completion(outcome, started)
                case ListCells(session_id=session_id):
                    cells = await self._sessions[session_id].cells()
                    result = Ok(value=CellList(cells=cells))
                case GetUsage(session_id=session_id):
                    usage = await self._sessions[session_id].usage()
                    result = Ok(value=UsageReport(usage=usage))
                case ShutdownSession(session_id=session_id):
                    await self._sessions[session_id].shutdown()
                    del self._sessions[session_id]
                    result = Ok(value=SessionClosed(session_id=session_id))
        except Exception as error:
            result = failed(error, "request", request_id)
        finally:
            self._active.pop(request_id, None)
        self._respond(request_id, result)

    def _open(self, request: OpenSession) -> Ok[HostResponse] | Err:
        # Invalid limits raise InvalidRequestError, answered by `_run` with its kind.
        limits = (request.cell_execution_limits or CellLimits()).checked()
        on_commit = None
        if request.keep_stored_values:
            on_commit = functools.partial(self._committed, request.session_id)
        self._sessions[request.session_id] = RuntimeSession(
            self._engine,
            self._nursery,
            limits,
            max_response_bytes=RESPONSE_BUDGET,
            store_load=request.store_load,
            admission=self.admission,
            workers=self._workers,
            watch=self._watch,
            stored_values=request.stored_values,
            on_commit=on_commit,
        )
        return Ok(value=SessionReady(session_id=request.session_id))

    def _committed(self, session_id: str, values: dict[str, bytes]) -> None:
        """A cell of a session that keeps its stored values committed `values`: the client
        hears of it before the cell's completion (its frames follow in order)."""
        if self._disconnected:
            return
        self._connection.committed(session_id, values)
        self._flush()

    def _start_execute(self, request_id: int, request: Execute, operation: Operation) -> None:
        """Admit and start an execute's cell in the reader's step, and answer
        `ExecutionStarted`; its initial observation is answered when something first wakes
        it (`_initial_woken`, rule 8 of `runtime/_observer.py`): before that, a task awaiting
        it would only find nothing to answer."""
        started = time.perf_counter()
        session_id = request.session_id
        try:
            session = self._sessions[session_id]
            delegate = RemoteDelegate(self, session_id, request.trace)
            report_to = delegate.keep_report if delegate.wants_report else None
            if type(request) is _EXECUTE_TO_PENDING:
                cell = session.start_to_pending(request.request, delegate, report_to=report_to)
            else:
                cell = session.start(request.request, delegate, report_to=report_to)
                operation.observed = (session_id, cell.cell_id)
        except Exception as error:
            self._active.pop(request_id, None)
            self._respond(request_id, failed(error, "execute", request_id))
            return
        operation.end_observation = cell.initial.cancel
        self._respond(request_id, Ok(value=ExecutionStarted(cell_id=cell.cell_id)))
        cell.initial.start_when_woken(
            functools.partial(self._initial_woken, request_id, cell, started)
        )

    def _initial_woken(self, request_id: int, cell: RuntimeCell, started: float) -> None:
        """The initial observation's first wake. In the engine's collector (the cell's own
        events woke it), its response is taken after the batch, without a task, if it has
        one by then (`_answer_initial_now`); anywhere else a task awaits it."""
        answer = functools.partial(self._answer_initial_now, request_id, cell, started)
        if not self._engine.call_after_dispatch(answer):
            self._nursery.start_soon(self._observe_initial, request_id, cell, started)

    def _answer_initial_now(self, request_id: int, cell: RuntimeCell, started: float) -> None:
        # Taking a completion closes the cell, which queues its `cell/closed`: the flush waits
        # for the response, so that both frames leave in one write. Flushed first, the
        # `cell/closed` left alone and woke the client for a frame it does not wait for, and
        # the response took a second write and often a second read and pass of the client.
        flush, self._flush = self._flush, _nothing
        try:
            self._answer_initial_taken(request_id, cell, started)
        finally:
            self._flush = flush
            flush()

    def _answer_initial_taken(self, request_id: int, cell: RuntimeCell, started: float) -> None:
        initial: Ok[RuntimeResponse | Pending] | Err
        try:
            response = cell.initial_response_now()
        except ObservationCancelledError:
            initial = CANCELLED
        except Exception as error:
            initial = failed(error, "execute", request_id)
        else:
            if response is None:  # a window that has not ended, a frontier: a task waits
                self._nursery.start_soon(self._observe_initial, request_id, cell, started)
                return
            initial = Ok(value=timed(response, started))
        if cell.closing and not cell.closed.is_set():
            self._nursery.start_soon(self._answer_initial_at_close, request_id, cell, initial)
        else:
            self._answer_initial(request_id, initial)

    async def _observe_initial(self, request_id: int, cell: RuntimeCell, started: float) -> None:
        """An execute's initial observation, answered as `operation/initial`."""
        initial: Ok[RuntimeResponse | Pending] | Err = CANCELLED
        try:
            initial = Ok(value=timed(await cell.initial_response(), started))
        except ObservationCancelledError:
            pass
        except Exception as error:
            initial = failed(error, "execute", request_id)
        except BaseException:  # cancelled: the connection is going away, nobody is answered
            self._active.pop(request_id, None)
            raise
        await self._answer_initial_at_close(request_id, cell, initial)

    async def _answer_initial_at_close(
        self, request_id: int, cell: RuntimeCell, initial: Ok[RuntimeResponse | Pending] | Err
    ) -> None:
        if cell.closing:
            # Its `cell/closed` follows in a moment: answer then, and both frames leave in one
            # write (one wake-up of the client instead of two).
            try:
                await cell.closed.wait()
            except BaseException:
                self._active.pop(request_id, None)
                raise
        self._answer_initial(request_id, initial)

    def _answer_initial(
        self, request_id: int, initial: Ok[RuntimeResponse | Pending] | Err
    ) -> None:
        self._active.pop(request_id, None)
        if self._disconnected:
            return
        self._connection.respond_initial(request_id, initial)
        self._flush()

    # ---- reverse calls -------------------------------------------------------------------

    async def call_client(
        self, session_id: str, cell_id: str, request: ToolInvoke | NotificationSend
    ) -> DelegateResult:
        """Send a reverse call and await its answer (cancellation sends `delegate/cancel`)."""
        call_id = self._send_call(session_id, cell_id, request)
        if not isinstance(call_id, int):  # an id, as a rule: tested first (`_OBSERVING`, above)
            return call_id
        self._track(call_id, session_id, cell_id, request)
        slot: OneShot[DelegateResult] = OneShot()
        self._calls[call_id] = slot
        self._flush()
        try:
            return await slot.get()
        finally:
            del self._calls[call_id]
            self._tool_calls.pop(call_id, None)
            if not slot.is_set():
                self._connection.cancel_call(call_id)
                self._flush()

    def _send_call(
        self, session_id: str, cell_id: str, request: ToolInvoke | NotificationSend
    ) -> int | Err:
        """Queue a reverse call: its id, or the error that fails it at once."""
        if self._disconnected:
            return Err(kind=ErrorKind.INTERNAL, message=CLIENT_GONE)
        try:
            return self._connection.call_client(session_id, cell_id, request)
        except FrameTooLargeError as too_large:
            return Err(kind=ErrorKind.FRAME_LIMIT, message=str(too_large))
        except LocalProtocolError as error:
            return Err(kind=ErrorKind.INTERNAL, message=str(error))

    def forward_call(
        self,
        session_id: str,
        cell_id: str,
        request: ToolInvoke,
        on_result: Callable[[DelegateResult], None],
    ) -> Callable[[], None]:
        """Send a reverse call whose answer goes to `on_result` (at once if it cannot be
        sent); returns its cancel, which sends `delegate/cancel` unless it was answered."""
        call_id = self._send_call(session_id, cell_id, request)
        if not isinstance(call_id, int):  # an id, as a rule: tested first (`_OBSERVING`, above)
            on_result(call_id)
            return _nothing
        self._forwards[call_id] = on_result
        self._track(call_id, session_id, cell_id, request)
        self._flush()

        def cancel() -> None:
            self._tool_calls.pop(call_id, None)
            if self._forwards.pop(call_id, None) is not None:
                self._connection.cancel_call(call_id)
                self._flush()

        return cancel

    def _track(
        self, call_id: int, session_id: str, cell_id: str, request: ToolInvoke | NotificationSend
    ) -> None:
        if isinstance(request, ToolInvoke):
            runtime_id = request.invocation.runtime_tool_call_id
            self._tool_calls[call_id] = (session_id, cell_id, runtime_id)

    def cell_closed(self, session_id: str, cell_id: str, report: CellReport | None = None) -> None:
        if self._disconnected:
            return
        self._connection.cell_closed(session_id, cell_id, report)
        self._flush()

    def inventory(self) -> dict[str, list[CellInfo]]:
        """Every session's live cells, by session id (the host's SIGUSR1 log)."""
        return {sid: session.inventory() for sid, session in self._sessions.items()}

    # ---- the end -----------------------------------------------------------------------

    def disconnect(self) -> None:
        """The client is gone: reverse calls fail, active requests are cancelled."""
        self._disconnected = True
        gone = Err(kind=ErrorKind.INTERNAL, message=CLIENT_GONE)
        for slot in self._calls.values():
            slot.set(gone)
        self._tool_calls.clear()
        forwards, self._forwards = self._forwards, {}
        for forward in forwards.values():
            forward(gone)
        for operation in self._active.values():
            operation.cancel()

    async def shutdown(self) -> None:
        """Shut every session down (the client went away), and let go of the engine, which
        may outlive the connection (a listening host's)."""
        try:
            async with trio.open_nursery() as nursery:
                for session in self._sessions.values():
                    nursery.start_soon(session.shutdown)
            self._sessions.clear()
        finally:
            self._engine.forget_release(self._workers.dismiss_parked)


def _nothing() -> None:
    """The cancel of a call that was answered when it was sent; the flush while an initial
    response is taken after the collector's batch."""
