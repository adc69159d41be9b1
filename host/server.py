"""The host side of the wire: frames in, runtime calls, frames out (reference-host section 4.1).

`serve_connection(receive, send)` speaks the protocol on one byte stream pair: handshake, then
every operation request as its own task, reverse calls (tool calls, notifications) to the client,
and `cell/closed` when a cell is gone. It returns the process exit status.

Rules:
1. One writer: every frame is encoded (and its size checked) before it is queued, then written
   in queue order by a single task, so the order of queueing is the order on the wire.
2. Per cell: `execution/started`, then its reverse calls and its initial response, then
   `cell/closed` (held back until the initial response is queued).
3. An oversized response or initial response is replaced by an error frame with the same id;
   an oversized reverse call fails only that call. The host stays up.
4. When the client goes away (EOF on stdin) every session is shut down, bounded by 5 s.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import time
from collections.abc import Callable, Iterator

import msgspec
import trio
from codemode_host.engine import Engine, open_engine
from codemode_host.runtime import RuntimeSession

from codemode import (
    CellLimits,
    CodeModeError,
    JsonValue,
    NestedToolCall,
    RuntimeResponse,
    ToolError,
    WaitOutcome,
)
from codemode._frame_stream import receive_message
from codemode._oneshot import OneShot
from codemode.protocol import (
    LIMITS_CAPABILITY,
    PROTOCOL_VERSION,
    CellClosed,
    ClientMessage,
    DelegateCancel,
    DelegateRequest,
    DelegateResponse,
    Err,
    Execute,
    ExecutionStarted,
    FrameDecoder,
    FrameEncoder,
    FrameTooLargeError,
    Hello,
    HostRequest,
    HostResponse,
    InitialResponse,
    InvalidHello,
    MissingRequiredCapability,
    NoCompatibleVersion,
    NotificationDelivered,
    NotificationSend,
    Ok,
    OpenSession,
    OperationCancel,
    OperationRequest,
    OperationResponse,
    ProtocolError,
    Ready,
    Rejected,
    SessionClosed,
    SessionReady,
    ShutdownSession,
    Terminate,
    ToolInvoke,
    ToolResult,
    Wait,
    WaitCompleted,
)

logger = logging.getLogger("codemode.host")

DelegateResult = Ok[ToolResult | NotificationDelivered] | Err

SUPPORTED_CAPABILITIES = frozenset({LIMITS_CAPABILITY})
SHUTDOWN_TIMEOUT = 5.0


class ConnectionFatalError(Exception):
    """The client broke the protocol; the host stops serving this connection."""


def _with_duration(response: RuntimeResponse, started: float) -> RuntimeResponse:
    return msgspec.structs.replace(response, host_duration=time.perf_counter() - started)


def _outcome_with_duration(outcome: WaitOutcome, started: float) -> WaitOutcome:
    return msgspec.structs.replace(outcome, response=_with_duration(outcome.response, started))


class _Operation:
    """An in-flight request that `operation/cancel` may target."""

    def __init__(self) -> None:
        self.cancelled = False
        self._scope: trio.CancelScope | None = None

    def cancel(self) -> None:
        self.cancelled = True
        if self._scope is not None:
            self._scope.cancel()

    @contextlib.contextmanager
    def cancellable(self) -> Iterator[trio.CancelScope]:
        """A cancel scope that `cancel()` cancels (at once if it already was)."""
        with trio.CancelScope() as scope:
            if self.cancelled:
                scope.cancel()
            self._scope = scope
            try:
                yield scope
            finally:
                self._scope = None


class _CellRoute:
    """Holds back a cell's `cell/closed` until its initial response is queued (rule 2)."""

    def __init__(self, host: _Host, session_id: str) -> None:
        self._host = host
        self.session_id = session_id
        self.cell_id: str | None = None
        self._initial_sent = False
        self._closed = False

    def initial_sent(self) -> None:
        self._initial_sent = True
        if self._closed:
            self._send_closed()

    def close(self, cell_id: str) -> None:
        self.cell_id = cell_id
        self._closed = True
        if self._initial_sent:
            self._send_closed()

    def _send_closed(self) -> None:
        assert self.cell_id is not None
        self._host.send(CellClosed(session_id=self.session_id, cell_id=self.cell_id))
        self._host.route_finished(self)


class _RemoteDelegate:
    """The delegate of one execute: forwards tool calls and notifications to the client."""

    def __init__(self, host: _Host, route: _CellRoute) -> None:
        self._host = host
        self._route = route

    async def invoke_tool(self, call: NestedToolCall) -> JsonValue:
        result = await self._host.call_client(self._route.session_id, ToolInvoke(invocation=call))
        if isinstance(result, Err):
            raise ToolError(result.message)
        if not isinstance(result.value, ToolResult):
            raise ToolError("code-mode client returned an invalid tool result")
        return result.value.result

    async def notify(self, call_id: str, cell_id: str, text: str) -> None:
        request = NotificationSend(call_id=call_id, cell_id=cell_id, text=text)
        result = await self._host.call_client(self._route.session_id, request)
        if isinstance(result, Err):
            raise CodeModeError(result.message)
        if not isinstance(result.value, NotificationDelivered):
            raise CodeModeError("code-mode client returned an invalid notification result")

    def cell_closed(self, cell_id: str) -> None:
        self._route.close(cell_id)


class _Host:
    """The state of one client connection: sessions, requests, reverse calls."""

    def __init__(self, engine: Engine, nursery: trio.Nursery, send: Callable[[bytes], None]):
        self._engine = engine
        self._nursery = nursery
        self._write = send
        self._encoder = FrameEncoder()
        self._sessions: dict[str, RuntimeSession] = {}
        self._seen_sessions: set[str] = set()
        self._routes: dict[str, set[_CellRoute]] = {}
        self._routes_empty: dict[str, trio.Event] = {}
        self._active: dict[int, _Operation] = {}
        self._calls: dict[int, OneShot[DelegateResult]] = {}
        self._delegate_ids = itertools.count(1)
        self._capabilities: frozenset[str] = frozenset()
        self.disconnected = False

    # ---- output ----------------------------------------------------------------------------

    def send(self, message: object) -> None:
        """Encode and queue a frame; raises FrameTooLargeError (nothing queued)."""
        self._write(self._encoder.encode(message))

    def _respond(self, request_id: int, result: Ok[HostResponse] | Err) -> None:
        try:
            self.send(OperationResponse(id=request_id, result=result))
        except FrameTooLargeError as error:
            message = f"code-mode host response exceeds the IPC frame limit: {error}"
            self.send(OperationResponse(id=request_id, result=Err(message=message)))

    def _send_initial(self, request_id: int, result: Ok[RuntimeResponse] | Err) -> None:
        try:
            self.send(InitialResponse(id=request_id, result=result))
        except FrameTooLargeError as error:
            message = f"code-mode initial response exceeds the IPC frame limit: {error}"
            self.send(InitialResponse(id=request_id, result=Err(message=message)))

    # ---- handshake -------------------------------------------------------------------------

    def handshake(self, message: ClientMessage) -> bool:
        """Answer the first frame; False if the connection was rejected."""
        if not isinstance(message, Hello):
            reason = InvalidHello(message="first message must be connection/hello")
            self.send(Rejected(reason=reason))
            return False
        if PROTOCOL_VERSION not in message.supported_versions:
            self.send(Rejected(reason=NoCompatibleVersion(supported_versions=[PROTOCOL_VERSION])))
            return False
        listed = set(message.required_capabilities) | set(message.optional_capabilities)
        offered = SUPPORTED_CAPABILITIES & listed
        for capability in message.required_capabilities:
            if capability not in offered:
                self.send(Rejected(reason=MissingRequiredCapability(capability=capability)))
                return False
        self._capabilities = frozenset(offered)
        self.send(Ready(selected_version=PROTOCOL_VERSION, capabilities=sorted(offered)))
        return True

    # ---- incoming --------------------------------------------------------------------------

    def dispatch(self, message: ClientMessage) -> None:
        match message:
            case OperationRequest(id=request_id, request=request):
                if request_id in self._active:
                    raise ConnectionFatalError(f"duplicate code-mode request ID {request_id}")
                operation = _Operation()
                self._active[request_id] = operation
                self._nursery.start_soon(self._run_request, request_id, request, operation)
            case OperationCancel(id=request_id):
                cancelled = self._active.get(request_id)
                if cancelled is not None:
                    cancelled.cancel()
            case DelegateResponse(id=call_id, result=result):
                call = self._calls.pop(call_id, None)
                if call is not None:  # unknown or cancelled ids are ignored
                    call.set(result)
            case Hello():
                raise ConnectionFatalError("received a second code-mode client hello")

    async def _run_request(
        self, request_id: int, request: HostRequest, operation: _Operation
    ) -> None:
        started = time.perf_counter()
        try:
            match request:
                case Execute():
                    await self._execute(request_id, request, operation, started)
                    return
                case Wait():
                    result: Ok[HostResponse] | Err = await self._wait(request, operation, started)
                case OpenSession():
                    result = self._open(request)
                case Terminate(session_id=session_id, cell_id=cell_id):
                    outcome = await self._session(session_id).terminate(cell_id)
                    result = Ok(
                        value=WaitCompleted(outcome=_outcome_with_duration(outcome, started))
                    )
                case ShutdownSession():
                    result = await self._shutdown_session(request.session_id)
        except CodeModeError as error:
            result = Err(message=str(error))
        except Exception as error:
            logger.exception("code-mode request %s failed", request_id)
            result = Err(message=f"code-mode request task failed: {error}")
        finally:
            self._active.pop(request_id, None)
        self._respond(request_id, result)

    def _session(self, session_id: str) -> RuntimeSession:
        session = self._sessions.get(session_id)
        if session is None:
            raise CodeModeError(f"unknown code-mode session {session_id}")
        return session

    def _open(self, request: OpenSession) -> Ok[HostResponse] | Err:
        session_id = request.session_id
        if not session_id:
            return Err(message="invalid code-mode session ID: empty")
        if session_id in self._sessions:
            return Err(message=f"code-mode session ID `{session_id}` is already open")
        if session_id in self._seen_sessions:
            return Err(message=f"code-mode session ID `{session_id}` was reused")
        limits = request.cell_execution_limits or CellLimits()
        if (
            request.cell_execution_limits is not None
            and LIMITS_CAPABILITY not in self._capabilities
        ):
            return Err(
                message="invalid code-mode session execution limits:"
                f" {LIMITS_CAPABILITY} was not negotiated"
            )
        problem = limits.problem()
        if problem is not None:
            return Err(message=f"invalid code-mode session execution limits: {problem}")
        self._seen_sessions.add(session_id)
        self._sessions[session_id] = RuntimeSession(self._engine, self._nursery, limits)
        self._routes[session_id] = set()
        return Ok(value=SessionReady(session_id=session_id))

    async def _execute(
        self, request_id: int, request: Execute, operation: _Operation, started: float
    ) -> None:
        route = _CellRoute(self, request.session_id)
        try:
            session = self._session(request.session_id)
            with operation.cancellable() as scope:
                await trio.lowlevel.checkpoint()
                started_cell = await session.execute(request.request, _RemoteDelegate(self, route))
            if scope.cancelled_caught:
                raise CodeModeError("code-mode request cancelled")
        except CodeModeError as error:
            self._respond(request_id, Err(message=str(error)))
            return
        route.cell_id = started_cell.cell_id
        self._routes[request.session_id].add(route)
        self._respond(request_id, Ok(value=ExecutionStarted(cell_id=started_cell.cell_id)))
        # From here on the answer is the initial response; cancelling it does not stop the cell
        # (the client terminates a cell it no longer wants).
        initial: Ok[RuntimeResponse] | Err = Err(message="code-mode request cancelled")
        try:
            with operation.cancellable():
                response = await started_cell.initial_response()
                initial = Ok(value=_with_duration(response, started))
        except CodeModeError as error:
            initial = Err(message=str(error))
        except Exception as error:
            logger.exception("code-mode execute %s failed", request_id)
            initial = Err(message=f"code-mode request task failed: {error}")
        self._send_initial(request_id, initial)
        route.initial_sent()

    async def _wait(
        self, request: Wait, operation: _Operation, started: float
    ) -> Ok[HostResponse] | Err:
        session = self._session(request.session_id)
        result: Ok[HostResponse] | Err = Err(message="code-mode request cancelled")
        with operation.cancellable():
            outcome = await session.wait(request.request)
            result = Ok(value=WaitCompleted(outcome=_outcome_with_duration(outcome, started)))
        return result

    async def _shutdown_session(self, session_id: str) -> Ok[HostResponse] | Err:
        session = self._session(session_id)
        del self._sessions[session_id]
        await session.shutdown()
        routes = self._routes.get(session_id, set())
        if routes:
            empty = self._routes_empty.setdefault(session_id, trio.Event())
            await empty.wait()
        self._routes.pop(session_id, None)
        self._routes_empty.pop(session_id, None)
        return Ok(value=SessionClosed(session_id=session_id))

    def route_finished(self, route: _CellRoute) -> None:
        routes = self._routes.get(route.session_id)
        if routes is None:
            return
        routes.discard(route)
        if not routes and route.session_id in self._routes_empty:
            self._routes_empty[route.session_id].set()

    # ---- reverse calls ---------------------------------------------------------------------

    async def call_client(
        self, session_id: str, request: ToolInvoke | NotificationSend
    ) -> DelegateResult:
        if self.disconnected:
            return Err(message="code-mode client connection closed")
        call_id = next(self._delegate_ids)
        try:
            frame = self._encoder.encode(
                DelegateRequest(id=call_id, session_id=session_id, request=request)
            )
        except FrameTooLargeError as error:
            return Err(message=str(error))
        call: OneShot[DelegateResult] = OneShot()
        self._calls[call_id] = call
        self._write(frame)
        try:
            await call.wait()
        except BaseException:
            if self._calls.pop(call_id, None) is not None and not self.disconnected:
                self.send(DelegateCancel(id=call_id))
            raise
        return call.value()

    def disconnect(self) -> None:
        """The client is gone: pending reverse calls fail, new requests are refused."""
        self.disconnected = True
        for call in self._calls.values():
            call.set(Err(message="code-mode client connection closed"))
        self._calls.clear()

    async def shutdown(self) -> None:
        """Shut every session down (the client went away)."""
        for operation in self._active.values():
            operation.cancel()
        async with trio.open_nursery() as nursery:
            for session in self._sessions.values():
                nursery.start_soon(session.shutdown)
        self._sessions.clear()


async def _write_frames(
    frames: trio.MemoryReceiveChannel[bytes],
    send: trio.abc.SendStream,
    on_failure: Callable[[], None],
) -> None:
    async with frames:
        try:
            async for frame in frames:
                await send.send_all(frame)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as error:
            logger.error("failed to write code-mode host message: %s", error)
            on_failure()


async def serve_connection(receive: trio.abc.ReceiveStream, send: trio.abc.SendStream) -> int:
    """Serve the protocol on one stream pair until the client closes it; the exit status."""
    decoder: FrameDecoder[ClientMessage] = FrameDecoder(ClientMessage)  # type: ignore[arg-type]
    frames_in, frames_out = trio.open_memory_channel[bytes](math.inf)
    status = 0
    reading = trio.CancelScope()

    def writer_failed() -> None:
        nonlocal status
        status = 1
        reading.cancel()

    def queue(frame: bytes) -> None:
        try:
            frames_in.send_nowait(frame)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the client is gone: nothing more can reach it

    async with open_engine() as engine, trio.open_nursery() as writer:
        writer.start_soon(_write_frames, frames_out, send, writer_failed)
        async with trio.open_nursery() as nursery:
            host = _Host(engine, nursery, queue)
            with reading:
                try:
                    first = await receive_message(receive, decoder)
                    if first is not None and host.handshake(first):
                        while (message := await receive_message(receive, decoder)) is not None:
                            host.dispatch(message)
                except (ProtocolError, ConnectionFatalError) as error:
                    logger.error("%s", error)
                    status = 1
                except trio.BrokenResourceError as error:
                    logger.error("failed to read code-mode client message: %s", error)
                    status = 1
            host.disconnect()
            with trio.move_on_after(SHUTDOWN_TIMEOUT) as bounded:
                await host.shutdown()
            if bounded.cancelled_caught:
                logger.error("timed out shutting down code-mode host state")
                status = 1
            nursery.cancel_scope.cancel()
        # The writer flushes what was queued, then ends; bounded in case the client stopped
        # reading.
        frames_in.close()
        writer.cancel_scope.deadline = trio.current_time() + SHUTDOWN_TIMEOUT
    return status
