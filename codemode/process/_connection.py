"""One connection to one host process: requests, reverse calls, cells, and loss of the host.

A thin trio adapter around the sans-IO codec: one reader task decodes frames and dispatches
them; writers go through one `StrictFIFOLock` and a write is never cut by cancellation (a cut
frame would corrupt the stream). A supervisor task waits for the process to exit.

Rules (reference-host 1.5, 1.6, 4.2 to 4.4):
1. Cells are registered the moment `execution/started` is read, before any later frame, so
   every reverse call finds its cell and the delegate given to `execute`.
2. A reverse call runs as a task in its cell's `CallbackGroup`; `delegate/cancel` cancels it and
   suppresses its answer. On `cell/closed` the cell's calls are cancelled, and `cell_closed`
   runs once they returned or after the 1 s grace.
3. The first failure wins: every pending operation fails with its text, every call in flight is
   cancelled, every live cell gets exactly one `cell_closed`, the process is killed and reaped.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections.abc import Awaitable, Callable
from functools import partial

import msgspec
import trio

from .._api import ExecuteRequest, RuntimeResponse, SessionDelegate
from .._callbacks import CLEANUP_GRACE, CallbackGroup
from .._frame_stream import receive_message
from .._oneshot import OneShot
from ..errors import CodeModeError, ToolError, error_from_message, tool_failure_message
from ..protocol import (
    LIMITS_CAPABILITY,
    PROTOCOL_VERSION,
    CellClosed,
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
    HostMessage,
    HostRequest,
    HostResponse,
    InitialResponse,
    NotificationDelivered,
    NotificationSend,
    Ok,
    OperationCancel,
    OperationRequest,
    OperationResponse,
    ProtocolError,
    Ready,
    Rejected,
    Terminate,
    ToolInvoke,
    ToolResult,
)
from ._host_process import forward_stderr

logger = logging.getLogger("codemode.process")

HANDSHAKE_TIMEOUT = 10.0
UNCANCELLABLE_TIMEOUT = 60.0
"""Bound on terminate and shutdown, which callers cannot cancel (reference-host 4.2)."""
CLOSE_TIMEOUT = 5.0

HostResult = Ok[HostResponse] | Err
InitialResult = Ok[RuntimeResponse] | Err
InitialSlot = OneShot[InitialResult]
"""Where the `execute/initialResponse` of one execute lands."""


class _Pending:
    """An operation waiting for its `operation/response`."""

    __slots__ = ("abandoned", "answer", "execute")

    def __init__(self) -> None:
        self.answer: OneShot[HostResult] = OneShot()
        self.abandoned = False
        self.execute: _ExecuteContext | None = None


class _ExecuteContext:
    __slots__ = ("delegate", "initial", "public_id", "session_id")

    def __init__(
        self, session_id: str, delegate: SessionDelegate, public_id: Callable[[str], str]
    ) -> None:
        self.session_id = session_id
        self.delegate = delegate
        self.public_id = public_id
        self.initial: InitialSlot = OneShot()


class ClientCell:
    """A live cell as the client sees it: who to call back, and its calls in flight."""

    def __init__(
        self,
        session_id: str,
        wire_id: str,
        public_id: str,
        delegate: SessionDelegate,
        nursery: trio.Nursery,
    ) -> None:
        self.session_id = session_id
        self.wire_id = wire_id
        self.public_id = public_id
        self.delegate = delegate
        self.calls = CallbackGroup(nursery)
        self.closed = trio.Event()


class HostConnection:
    """A spawned host process, after a successful handshake. Made by `connect`."""

    def __init__(self, process: trio.Process, nursery: trio.Nursery) -> None:
        assert process.stdin is not None
        assert process.stdout is not None
        self._process = process
        self._stdin = process.stdin
        self._stdout = process.stdout
        self._nursery = nursery
        self._encoder = FrameEncoder()
        self._decoder: FrameDecoder[HostMessage] = FrameDecoder(HostMessage)  # type: ignore[arg-type]
        self._send_lock = trio.StrictFIFOLock()
        self._request_ids = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self._initial: dict[int, InitialSlot] = {}
        self._cells: dict[tuple[str, str], ClientCell] = {}
        self._calls: dict[int, trio.CancelScope] = {}
        self._closing_cells: set[ClientCell] = set()
        self.capabilities: frozenset[str] = frozenset()
        self.alive = True
        self.failure: str | None = None
        self._background: set[trio.CancelScope] = set()

    # ---- lifecycle -------------------------------------------------------------------------

    async def _handshake(self) -> None:
        hello = Hello(
            supported_versions=[PROTOCOL_VERSION], optional_capabilities=[LIMITS_CAPABILITY]
        )
        await self._send(self._encoder.encode(hello))
        message = await self._read_message()
        if message is None:
            raise CodeModeError("code-mode host exited during handshake")
        if isinstance(message, Rejected):
            raise CodeModeError(f"code-mode host rejected the handshake: {message.reason!r}")
        if not isinstance(message, Ready) or message.selected_version != PROTOCOL_VERSION:
            raise CodeModeError(
                f"code-mode host returned an invalid handshake response: {message!r}"
            )
        self.capabilities = frozenset(message.capabilities)

    def _start(self) -> None:
        assert self._process.stderr is not None
        for task in (
            partial(forward_stderr, self._process.stderr),
            self._read_loop,
            self._supervise,
        ):
            self._nursery.start_soon(self._run_background, task)

    async def _run_background(self, task: Callable[[], Awaitable[None]]) -> None:
        # The connection's own tasks outlive a cancellation of the provider's block: its
        # shielded shutdown still needs the reader. `aclose` stops them (after the process).
        scope = trio.CancelScope(shield=True)
        self._background.add(scope)
        try:
            with scope:
                await task()
        finally:
            self._background.discard(scope)

    async def aclose(self) -> None:
        """Close stdin so the host exits (killed if it has not within CLOSE_TIMEOUT), then
        stop the connection's tasks."""
        with trio.CancelScope(shield=True):
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                async with self._send_lock:
                    await self._stdin.aclose()
            with trio.move_on_after(CLOSE_TIMEOUT):
                await self._process.wait()
            self._fail("code-mode host connection closed")
            await self._process.wait()
        for scope in list(self._background):
            scope.cancel()

    def abort(self, reason: str) -> None:
        """Give up on the host: everything pending fails with `reason`, the process is killed."""
        self._fail(reason)

    async def _supervise(self) -> None:
        status = await self._process.wait()
        self._fail(f"code-mode host exited with status {status}")
        async with self._send_lock:
            await self._stdin.aclose()

    # ---- the wire --------------------------------------------------------------------------

    async def _send(self, frame: bytes) -> None:
        async with self._send_lock:
            # Shielded: a frame cut by cancellation would corrupt the stream for everyone.
            with trio.CancelScope(shield=True):
                try:
                    await self._stdin.send_all(frame)
                except (trio.BrokenResourceError, trio.ClosedResourceError) as error:
                    self._fail(f"failed to write code-mode host message: {error}")
                    raise CodeModeError(self.failure or str(error)) from error

    def _send_soon(self, message: object) -> None:
        """Send from a context that cannot wait (a cancelled caller, the reader)."""
        frame = self._encoder.encode(message)
        self._nursery.start_soon(self._send_quietly, frame)

    async def _send_quietly(self, frame: bytes) -> None:
        try:
            await self._send(frame)
        except CodeModeError:
            pass  # the connection failed; _fail told everyone

    async def _read_message(self) -> HostMessage | None:
        return await receive_message(self._stdout, self._decoder)

    async def _read_loop(self) -> None:
        try:
            async with self._stdout:
                while (message := await self._read_message()) is not None:
                    self._dispatch(message)
        except ProtocolError as error:
            self._fail(f"failed to read code-mode host message: {error}")
        except (trio.BrokenResourceError, trio.ClosedResourceError) as error:
            self._fail(f"failed to read code-mode host message: {error}")
        else:
            self._fail("code-mode host closed its stdout")

    # ---- operations ------------------------------------------------------------------------

    def _check_alive(self) -> None:
        if not self.alive:
            raise CodeModeError(self.failure or "code-mode host connection closed")

    async def request(
        self,
        request: HostRequest,
        *,
        cancellable: bool = True,
        on_abandon: Callable[[OneShot[HostResult]], None] | None = None,
    ) -> HostResponse:
        """Send an operation and return its response value.

        Raises:
            CodeModeError: the host's error text, a frame-limit error, or the connection's
                failure text.
        """
        self._check_alive()
        request_id = next(self._request_ids)
        try:
            frame = self._encoder.encode(OperationRequest(id=request_id, request=request))
        except FrameTooLargeError as error:
            raise CodeModeError(f"code-mode request exceeds the IPC frame limit: {error}") from None
        pending = _Pending()
        return self._unwrap(await self._await(request_id, frame, pending, cancellable, on_abandon))

    async def execute(
        self,
        session_id: str,
        request: ExecuteRequest,
        delegate: SessionDelegate,
        public_id: Callable[[str], str],
    ) -> tuple[str, int, InitialSlot]:
        """Start a cell; returns its wire id, the execute's request id (to cancel the initial
        response) and where its initial response will land."""
        self._check_alive()
        request_id = next(self._request_ids)
        message = OperationRequest(
            id=request_id, request=Execute(session_id=session_id, request=request)
        )
        try:
            frame = self._encoder.encode(message)
        except FrameTooLargeError as error:
            raise CodeModeError(
                f"code-mode execute request exceeds the IPC frame limit: {error}"
            ) from None
        pending = _Pending()
        pending.execute = context = _ExecuteContext(session_id, delegate, public_id)
        response = self._unwrap(await self._await(request_id, frame, pending, True, None))
        if not isinstance(response, ExecutionStarted):
            raise CodeModeError("code-mode host returned an invalid execute response")
        return response.cell_id, request_id, context.initial

    def cancel_operation(self, request_id: int) -> None:
        """Ask the host to stop an execute's initial observation (or a wait) without waiting."""
        if self.alive:
            self._send_soon(OperationCancel(id=request_id))

    async def _await(
        self,
        request_id: int,
        frame: bytes,
        pending: _Pending,
        cancellable: bool,
        on_abandon: Callable[[OneShot[HostResult]], None] | None,
    ) -> HostResult:
        await self._send(frame)
        # Registered once sent (no checkpoint in between, so the answer cannot come first): a
        # caller cancelled before its frame left leaves nothing behind.
        self._check_alive()
        self._pending[request_id] = pending
        if pending.execute is not None:
            self._initial[request_id] = pending.execute.initial
        if not cancellable:
            with trio.CancelScope(shield=True) as bounded:
                bounded.deadline = trio.current_time() + UNCANCELLABLE_TIMEOUT
                await pending.answer.wait()
            if bounded.cancelled_caught:
                self._fail("code-mode host timed out waiting for a response")
        else:
            try:
                await pending.answer.wait()
            except trio.Cancelled:
                if not pending.answer.is_set() and self.alive:
                    pending.abandoned = True
                    self._send_soon(OperationCancel(id=request_id))
                    if on_abandon is not None:
                        on_abandon(pending.answer)
                raise
        return pending.answer.value()

    def _unwrap(self, result: HostResult) -> HostResponse:
        if isinstance(result, Err):
            raise error_from_message(result.message)
        return result.value

    # ---- incoming --------------------------------------------------------------------------

    def _dispatch(self, message: HostMessage) -> None:
        match message:
            case OperationResponse(id=request_id, result=result):
                self._on_response(request_id, result)
            case InitialResponse(id=request_id, result=initial):
                slot = self._initial.pop(request_id, None)
                if slot is None:
                    raise ProtocolError(
                        "code-mode host returned initial response for unknown request ID"
                        f" {request_id}"
                    )
                slot.set(initial)
            case DelegateRequest():
                self._on_delegate_request(message)
            case DelegateCancel(id=call_id):
                scope = self._calls.pop(call_id, None)
                if scope is not None:
                    scope.cancel()
            case CellClosed(session_id=session_id, cell_id=cell_id):
                cell = self._cells.pop((session_id, cell_id), None)
                if cell is None:
                    raise ProtocolError(
                        f"code-mode host closed unknown cell {cell_id} in session {session_id}"
                    )
                self._close_cell(cell)
            case Ready() | Rejected():
                raise ProtocolError("code-mode host sent a second handshake response")

    def _on_response(self, request_id: int, result: HostResult) -> None:
        pending = self._pending.pop(request_id, None)
        if pending is None:
            raise ProtocolError(f"code-mode host returned unknown request ID {request_id}")
        context = pending.execute
        if context is not None:
            if isinstance(result, Ok) and isinstance(result.value, ExecutionStarted):
                wire_id = result.value.cell_id
                key = (context.session_id, wire_id)
                if key in self._cells:
                    raise ProtocolError(
                        f"code-mode host reused live cell {wire_id} in session {context.session_id}"
                    )
                self._cells[key] = ClientCell(
                    context.session_id,
                    wire_id,
                    context.public_id(wire_id),
                    context.delegate,
                    self._nursery,
                )
                if pending.abandoned:
                    # Its caller went away: the cell must not run unobserved forever.
                    terminate = Terminate(session_id=context.session_id, cell_id=wire_id)
                    self._nursery.start_soon(self._fire_and_forget, terminate)
            else:
                self._initial.pop(request_id, None)
        pending.answer.set(result)

    async def _fire_and_forget(self, request: HostRequest) -> None:
        try:
            await self.request(request, cancellable=False)
        except CodeModeError:
            pass

    def _on_delegate_request(self, message: DelegateRequest) -> None:
        request = message.request
        cell_id = request.invocation.cell_id if isinstance(request, ToolInvoke) else request.cell_id
        cell = self._cells.get((message.session_id, cell_id))
        if cell is None:
            raise ProtocolError(
                f"code-mode host delegated for unknown cell {cell_id}"
                f" in session {message.session_id}"
            )
        if message.id in self._calls:
            raise ProtocolError(f"duplicate code-mode delegate request ID {message.id}")
        self._calls[message.id] = cell.calls.start(self._run_call, message.id, cell, request)

    async def _run_call(
        self, call_id: int, cell: ClientCell, request: ToolInvoke | NotificationSend
    ) -> None:
        result: Ok[ToolResult | NotificationDelivered] | Err
        try:
            if isinstance(request, ToolInvoke):
                # The delegate sees the public cell id (`g2:1` after a host restart).
                invocation = msgspec.structs.replace(request.invocation, cell_id=cell.public_id)
                value = await cell.delegate.invoke_tool(invocation)
                result = Ok(value=ToolResult(result=value))
            else:
                await cell.delegate.notify(request.call_id, cell.public_id, request.text)
                result = Ok(value=NotificationDelivered())
        except ToolError as error:
            result = Err(message=error.text)
        except Exception as error:
            logger.warning("code-mode delegate task failed", exc_info=True)
            result = Err(message=self._failure_text(request, error))
        if self._calls.pop(call_id, None) is None or not self.alive:
            return  # cancelled by the host, or the host is gone: no late answer
        try:
            frame = self._encoder.encode(DelegateResponse(id=call_id, result=result))
        except FrameTooLargeError as error:
            text = f"code-mode delegate response exceeds the IPC frame limit: {error}"
            frame = self._encoder.encode(DelegateResponse(id=call_id, result=Err(message=text)))
        except (TypeError, ValueError, OverflowError) as error:
            text = self._failure_text(request, error)
            frame = self._encoder.encode(DelegateResponse(id=call_id, result=Err(message=text)))
        await self._send_quietly(frame)

    @staticmethod
    def _failure_text(request: ToolInvoke | NotificationSend, error: BaseException) -> str:
        if isinstance(request, ToolInvoke):
            return tool_failure_message(request.invocation.tool_name.name, error)
        return f"code-mode delegate task failed: {error}"

    def _close_cell(self, cell: ClientCell) -> None:
        """Cancel the cell's calls; `cell_closed` once they returned or after the grace."""
        cell.calls.cancel("the cell closed")
        self._closing_cells.add(cell)
        # A background task: `cell_closed` is owed even if the provider's block is cancelled.
        self._nursery.start_soon(self._run_background, partial(self._finish_cell, cell))

    async def _finish_cell(self, cell: ClientCell) -> None:
        with trio.move_on_after(CLEANUP_GRACE):
            await cell.calls.wait_idle()
        self._closing_cells.discard(cell)
        try:
            cell.delegate.cell_closed(cell.public_id)
        except Exception:
            logger.exception("cell_closed(%r) raised", cell.public_id)
        cell.closed.set()

    def cells_of(self, session_id: str) -> list[ClientCell]:
        """The session's cells that are live or closing (their cell_closed still to come)."""
        live = [c for (s, _), c in self._cells.items() if s == session_id]
        return live + [c for c in self._closing_cells if c.session_id == session_id]

    # ---- failure ---------------------------------------------------------------------------

    def _fail(self, reason: str) -> None:
        if not self.alive:
            return
        self.alive = False
        self.failure = reason
        logger.debug("code-mode host connection failed: %s", reason)
        for pending in self._pending.values():
            pending.answer.set(Err(message=reason))
        self._pending.clear()
        for slot in self._initial.values():
            slot.set(Err(message=reason))
        self._initial.clear()
        self._calls.clear()
        for cell in self._cells.values():
            self._close_cell(cell)
        self._cells.clear()
        if self._process.returncode is None:
            self._process.kill()


async def connect(
    process: trio.Process, nursery: trio.Nursery, handshake_timeout: float = HANDSHAKE_TIMEOUT
) -> HostConnection:
    """Handshake with a freshly spawned host; on any failure the process is killed and reaped."""
    connection = HostConnection(process, nursery)
    try:
        with trio.fail_after(handshake_timeout):
            await connection._handshake()
    except trio.TooSlowError:
        await _kill(process)
        raise CodeModeError("timed out negotiating with the code-mode host") from None
    except (CodeModeError, ProtocolError, trio.BrokenResourceError) as error:
        await _kill(process)
        if isinstance(error, CodeModeError):
            raise
        raise CodeModeError(f"failed to read code-mode host hello: {error}") from error
    except BaseException:
        with trio.CancelScope(shield=True):
            await _kill(process)
        raise
    connection._start()
    return connection


async def _kill(process: trio.Process) -> None:
    if process.returncode is None:
        process.kill()
    await process.wait()
