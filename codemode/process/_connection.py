"""One host process and its connection: the trio adapter around `ClientConnection`.

The protocol's rules live in the sans-IO `ClientConnection`; `HostLink` only moves bytes and
runs tasks, all in a nursery of its own that `run` opens (started with `nursery.start` once the
handshake succeeded):

- the writer sends whatever the connection queued, all of it in one write;
- the reader feeds bytes to the connection and dispatches its events (`_pump`): answers land in
  one-shot slots, reverse calls run as tasks in their cell's `CallbackGroup`, `cell/closed`
  cancels a cell's calls and calls `cell_closed` once they returned or after the grace;
- the supervisor waits for the process; stderr is forwarded from the moment of the spawn.

Rules:
1. The first failure wins (`_lost`): every slot gets a `HostLostError` with its text (the
   cause chained), every call in flight is cancelled, every live cell gets exactly one
   `cell_closed`, the process is killed and reaped.
2. A host that exits is reported only once its stdout is drained (bounded): answers it wrote
   before exiting still reach their callers.
3. Once started, the link's tasks are shielded from the provider's cancellation (the provider's
   bounded shutdown still needs the reader); `aclose()` lifts that, with a deadline.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, NoReturn

import msgspec
import trio

from .._api import CellLimits, ExecuteRequest, SessionDelegate
from .._trio import CLEANUP_GRACE, CallbackGroup, OneShot, open_service_nursery
from ..errors import ErrorKind, HostLostError, ToolError, tool_failure_message
from ..protocol import (
    LIMITS_CAPABILITY,
    NEED_DATA,
    Answered,
    CellEnded,
    ClientConnection,
    ClientEvent,
    ConnectionEnded,
    DelegateCancelled,
    DelegateRequested,
    Err,
    ExecutionStarted,
    HandshakeCompleted,
    HandshakeRejected,
    HostResponse,
    InitialAnswered,
    NotificationDelivered,
    Ok,
    RemoteProtocolError,
    ToolInvoke,
    ToolResult,
)
from ._host_process import StderrTail, spawn_host

logger = logging.getLogger("codemode.process")

HANDSHAKE_TIMEOUT = 10.0
CLOSE_TIMEOUT = 5.0
"""Seconds a closing host has to exit after its stdin closed, before it is killed."""
DRAIN_TIMEOUT = 1.0
"""Seconds to read what an exited host left in its stdout pipe (rule 2)."""
READ_CHUNK = 1 << 20

HostResult = Ok[HostResponse] | Err
InitialResult = Ok[Any] | Err


class ClientCell:
    """A live cell as the client sees it: who to call back, and its calls in flight."""

    def __init__(
        self, session_id: str, public_id: str, delegate: SessionDelegate, nursery: trio.Nursery
    ) -> None:
        self.session_id = session_id
        self.public_id = public_id
        self.delegate = delegate
        self.calls = CallbackGroup(nursery)
        self.closed = trio.Event()


class _Execute:
    """What an execute needs once the host admits its cell."""

    __slots__ = ("delegate", "public_id", "session_id")

    def __init__(
        self, session_id: str, delegate: SessionDelegate, public_id: Callable[[str], str]
    ) -> None:
        self.session_id = session_id
        self.delegate = delegate
        self.public_id = public_id


class HostLink:
    """A host process and its connection, from spawn to loss. Started by `run`."""

    def __init__(self, command: list[str], handshake_timeout: float = HANDSHAKE_TIMEOUT) -> None:
        self._command = command
        self._handshake_timeout = handshake_timeout
        self._connection = ClientConnection(optional_capabilities=[LIMITS_CAPABILITY])
        self._stderr = StderrTail()
        self._process: trio.Process | None = None
        self._nursery: trio.Nursery | None = None
        self._life: trio.CancelScope | None = None
        self._queued = trio.Event()
        self._handshake: OneShot[HandshakeCompleted | HandshakeRejected | None] = OneShot()
        # Slots of the callers awaiting answers, with the session each request was for.
        self._answers: dict[int, tuple[OneShot[HostResult | HostLostError], str]] = {}
        self._initials: dict[int, tuple[OneShot[InitialResult | HostLostError], str]] = {}
        self._executes: dict[int, _Execute] = {}
        self._cells: dict[tuple[str, str], ClientCell] = {}
        self._closing_cells: dict[tuple[str, str], ClientCell] = {}
        self._calls: dict[int, trio.CancelScope] = {}
        self._stdout_done = trio.Event()
        self._ended = trio.Event()
        self._finished = trio.Event()
        self.failure: HostLostError | None = None

    @property
    def alive(self) -> bool:
        return self.failure is None

    @property
    def capabilities(self) -> frozenset[str]:
        return self._connection.capabilities

    # ---- lifecycle -------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Spawn the host, shake hands, then serve until the link is lost or closed.

        Raises (before `started`, to the caller of `nursery.start`):
            HostLostError: the host could not be spawned, exited, refused or did not answer
                the handshake in time; the text ends with its last stderr lines.
        """
        self._process = process = await spawn_host(self._command)
        assert process.stdin is not None
        assert process.stdout is not None
        assert process.stderr is not None
        try:
            with trio.CancelScope() as self._life:
                async with open_service_nursery() as nursery:
                    self._nursery = nursery
                    nursery.start_soon(self._stderr.forward, process.stderr)
                    nursery.start_soon(self._write, process.stdin)
                    nursery.start_soon(self._read, process.stdout)
                    nursery.start_soon(self._supervise, process)
                    await self._shake_hands()
                    self._life.shield = True  # rule 3
                    task_status.started()
                    await self._ended.wait()
                    await self._wait_closing_cells()
                    nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await _reap(process)
            self._finished.set()

    async def _shake_hands(self) -> None:
        """Wait for the host's answer to the hello (queued by the connection)."""
        self._flush()
        answer: HandshakeCompleted | HandshakeRejected | None = None
        with trio.move_on_after(self._handshake_timeout) as timer:
            answer = await self._handshake.get()
        if isinstance(answer, HandshakeCompleted):
            return
        process = self._process
        assert process is not None
        if timer.cancelled_caught:
            reason = "timed out negotiating with the code-mode host"
        elif isinstance(answer, HandshakeRejected):
            reason = f"code-mode host rejected the handshake: {answer.reason!r}"
        elif process.returncode is not None:
            reason = f"code-mode host exited during handshake with status {process.returncode}"
        else:
            assert self.failure is not None
            reason = str(self.failure)
        cause = self.failure.__cause__ if self.failure is not None else None
        self._lost(reason)
        with trio.move_on_after(DRAIN_TIMEOUT):
            await self._stderr.closed.wait()  # its last words explain the failure
        raise HostLostError(self._stderr.describe(reason)) from cause

    async def aclose(self) -> None:
        """Close the host's stdin so it shuts down and exits (killed after CLOSE_TIMEOUT),
        then end the link: its live cells get `cell_closed`. Bounded; idempotent."""
        process = self._process
        if process is not None and process.stdin is not None and self.alive:
            self._flush()
            with trio.move_on_after(CLOSE_TIMEOUT):
                await process.stdin.aclose()
                await process.wait()
        self._lost("code-mode host connection closed")
        if self._life is not None:
            self._life.deadline = trio.current_time() + CLOSE_TIMEOUT + CLEANUP_GRACE
        with trio.move_on_after(CLOSE_TIMEOUT + CLEANUP_GRACE):
            await self._finished.wait()

    def abort(self, reason: str) -> None:
        """Give up on the host now: everything pending fails with `reason`, it is killed."""
        self._lost(reason)

    def _lost(self, reason: str, cause: BaseException | None = None) -> None:
        """Rule 1: the first failure wins."""
        if self.failure is not None:
            return
        failure = HostLostError(reason)
        failure.__cause__ = cause
        self.failure = failure
        logger.debug("code-mode host connection failed: %s", reason)
        self._connection.connection_lost()
        self._handshake.set(None)  # wakes a handshake in progress
        for slots in (self._answers, self._initials):
            for slot, _ in slots.values():
                slot.set(failure)
        self._executes.clear()
        for scope in self._calls.values():
            scope.cancel()
        self._calls.clear()
        for key in list(self._cells):
            self._close_cell(key)
        if self._process is not None and self._process.returncode is None:
            self._process.kill()
        self._ended.set()

    async def _wait_closing_cells(self) -> None:
        while self._closing_cells:
            await next(iter(self._closing_cells.values())).closed.wait()

    # ---- the wire --------------------------------------------------------------------------

    def _flush(self) -> None:
        self._queued.set()

    async def _write(self, stdin: trio.abc.SendStream) -> NoReturn:
        while True:
            await self._queued.wait()
            self._queued = trio.Event()
            data = self._connection.data_to_send()
            if not data:
                continue
            try:
                await stdin.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as error:
                self._lost(f"failed to write code-mode host message: {error}", error)
                await trio.sleep_forever()

    async def _read(self, stdout: trio.abc.ReceiveStream) -> None:
        try:
            while True:
                data = await stdout.receive_some(READ_CHUNK)
                self._connection.receive_data(data)
                self._pump()
                if not data:
                    break
        except RemoteProtocolError as error:
            self._lost(f"failed to read code-mode host message: {error}", error)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as error:
            self._lost(f"failed to read code-mode host message: {error}", error)
        finally:
            self._stdout_done.set()
        process = self._process
        assert process is not None
        with trio.move_on_after(DRAIN_TIMEOUT):
            status = await process.wait()
            self._lost(f"code-mode host exited with status {status}")
        self._lost("code-mode host closed its stdout")

    async def _supervise(self, process: trio.Process) -> None:
        status = await process.wait()
        with trio.move_on_after(DRAIN_TIMEOUT):
            await self._stdout_done.wait()  # rule 2
        self._lost(f"code-mode host exited with status {status}")

    def _pump(self) -> None:
        """Dispatch every event the connection has (also those a call produced locally)."""
        if self.failure is not None:
            return
        try:
            while (event := self._connection.next_event()) is not NEED_DATA:
                self._dispatch(event)
        except RemoteProtocolError as error:
            self._lost(f"failed to read code-mode host message: {error}", error)
        self._flush()

    def _dispatch(self, event: ClientEvent) -> None:
        match event:
            case Answered(request_id=request_id, result=result):
                context = self._executes.pop(request_id, None)
                if context is not None and isinstance(result, Ok):
                    self._admit(context, result.value)
                self._deliver(self._answers.pop(request_id, None), request_id, result)
            case InitialAnswered(request_id=request_id, result=initial):
                self._deliver(self._initials.pop(request_id, None), request_id, initial)
            case DelegateRequested():
                self._start_call(event)
            case DelegateCancelled(call_id=call_id):
                scope = self._calls.pop(call_id, None)
                if scope is not None:
                    scope.cancel()
            case CellEnded(session_id=session_id, cell_id=cell_id):
                self._close_cell((session_id, cell_id))
            case HandshakeCompleted() | HandshakeRejected():
                self._handshake.set(event)
            case ConnectionEnded():
                pass  # the reader saw EOF: it names the cause once the process exited

    def _deliver(
        self,
        waiter: tuple[OneShot[Any], str] | None,
        request_id: int,
        result: HostResult | InitialResult,
    ) -> None:
        """Hand an answer to its caller; one whose caller was cancelled meanwhile goes back to
        the connection at once, before any later frame is read (nothing is lost)."""
        if waiter is None:
            return
        slot, session_id = waiter
        if not slot.set(result):
            self._connection.undelivered(request_id, session_id, result)

    # ---- operations ------------------------------------------------------------------------

    def _check(self) -> None:
        if self.failure is not None:
            raise self.failure

    async def _await(self, request_id: int, session_id: str) -> HostResult:
        slot: OneShot[HostResult | HostLostError] = OneShot()
        self._answers[request_id] = (slot, session_id)
        self._pump()
        try:
            answer = await slot.get()
        except BaseException:
            self._answers.pop(request_id, None)
            self._retire(request_id, slot)
            raise
        if isinstance(answer, HostLostError):
            raise answer
        return answer

    async def open_session(self, session_id: str, limits: CellLimits | None) -> HostResult:
        self._check()
        return await self._await(self._connection.open_session(session_id, limits), session_id)

    async def execute(
        self,
        session_id: str,
        request: ExecuteRequest,
        delegate: SessionDelegate,
        public_id: Callable[[str], str],
    ) -> tuple[HostResult, int]:
        """Start a cell; returns the answer and the execute's request id (the key of its
        initial response). Cancelled before the answer: the cell is terminated once admitted.

        Raises:
            FrameTooLargeError: the request does not fit in a frame (nothing was sent).
        """
        self._check()
        request_id = self._connection.execute(session_id, request)
        self._executes[request_id] = _Execute(session_id, delegate, public_id)
        return await self._await(request_id, session_id), request_id

    def _retire(self, request_id: int, slot: OneShot[Any]) -> None:
        """The caller of `request_id` went away before its answer: retire the request (an
        answer that arrives later is refused by the slot and taken back by `_deliver`)."""
        if self.alive and not slot.is_set():
            self._connection.cancel(request_id)
            self._pump()

    async def initial_response(self, request_id: int, session_id: str) -> InitialResult:
        """Take and await the initial response of execute `request_id` (cancelled: retired)."""
        self._check()
        self._connection.take_initial(request_id)
        slot: OneShot[InitialResult | HostLostError] = OneShot()
        self._initials[request_id] = (slot, session_id)
        self._pump()
        try:
            answer = await slot.get()
        except BaseException:
            self._initials.pop(request_id, None)
            self._retire(request_id, slot)
            raise
        if isinstance(answer, HostLostError):
            raise answer
        return answer

    def release_initial(self, request_id: int) -> None:
        if self.alive:
            self._connection.release_initial(request_id)
            self._pump()

    async def wait(self, session_id: str, cell_id: str, yield_time_ms: int) -> HostResult:
        self._check()
        return await self._await(
            self._connection.wait(session_id, cell_id, yield_time_ms), session_id
        )

    async def terminate(self, session_id: str, cell_id: str) -> HostResult:
        self._check()
        return await self._await(self._connection.terminate(session_id, cell_id), session_id)

    async def shutdown_session(self, session_id: str) -> HostResult:
        self._check()
        return await self._await(self._connection.shutdown_session(session_id), session_id)

    def cells_of(self, session_id: str) -> list[ClientCell]:
        """The session's cells that are live or closing (their `cell_closed` still to come)."""
        cells = [*self._cells.values(), *self._closing_cells.values()]
        return [cell for cell in cells if cell.session_id == session_id]

    async def settle(self, session_id: str, cell_id: str, *, closed: bool) -> None:
        """Wait until the cell's reverse calls returned (or, with `closed`, until its
        `cell_closed` ran), for at most the cleanup grace after they were cancelled.

        The host cancels a cell's calls before it answers with the cell's end; this makes
        that answer reach its caller after the application's delegate saw the cancellation,
        as in-process (DESIGN section 4). Shielded: the answer is already taken.
        """
        key = (session_id, cell_id)
        cell = self._cells.get(key) or self._closing_cells.get(key)
        if cell is None:
            return
        with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_TIMEOUT + CLEANUP_GRACE):
            if closed:
                await cell.closed.wait()
            else:
                await cell.calls.wait_idle()

    # ---- cells and reverse calls -----------------------------------------------------------

    def _admit(self, context: _Execute, value: object) -> None:
        assert isinstance(value, ExecutionStarted)
        assert self._nursery is not None
        public_id = context.public_id(value.cell_id)
        cell = ClientCell(context.session_id, public_id, context.delegate, self._nursery)
        self._cells[(context.session_id, value.cell_id)] = cell

    def _close_cell(self, key: tuple[str, str]) -> None:
        """Cancel the cell's calls; `cell_closed` once they returned or after the grace."""
        cell = self._cells.pop(key, None)
        if cell is None:
            return
        cell.calls.cancel("the cell closed")
        self._closing_cells[key] = cell
        assert self._nursery is not None
        self._nursery.start_soon(self._finish_cell, key, cell)

    async def _finish_cell(self, key: tuple[str, str], cell: ClientCell) -> None:
        with trio.move_on_after(CLEANUP_GRACE):
            await cell.calls.wait_idle()
        try:
            cell.delegate.cell_closed(cell.public_id)
        except Exception:
            logger.exception("cell_closed(%r) raised", cell.public_id)
        finally:
            del self._closing_cells[key]
            cell.closed.set()

    def _start_call(self, event: DelegateRequested) -> None:
        cell = self._cells.get((event.session_id, event.cell_id))
        if cell is None:  # the connection knows the cell; we do not: a bug, not the host's
            self._lost(f"code-mode client has no delegate for cell {event.cell_id}")
            return
        self._calls[event.call_id] = cell.calls.start(self._run_call, event, cell)

    async def _run_call(self, event: DelegateRequested, cell: ClientCell) -> None:
        request = event.request
        result: Ok[ToolResult | NotificationDelivered] | Err
        try:
            if isinstance(request, ToolInvoke):
                # The delegate sees the public cell id (`g2:1` after a host restart).
                call = msgspec.structs.replace(request.invocation, cell_id=cell.public_id)
                result = Ok(value=ToolResult(result=await cell.delegate.invoke_tool(call)))
            else:
                await cell.delegate.notify(request.call_id, cell.public_id, request.text)
                result = Ok(value=NotificationDelivered())
        except ToolError as error:
            result = Err(kind=ErrorKind.TOOL, message=error.text)
        except Exception as error:
            logger.warning("code-mode delegate task failed", exc_info=True)
            result = Err(kind=ErrorKind.TOOL, message=_failure_text(event, error))
        finally:
            self._calls.pop(event.call_id, None)
        try:
            self._connection.send_delegate_response(event.call_id, result)
        except (TypeError, ValueError, OverflowError, msgspec.EncodeError) as error:
            failure = Err(kind=ErrorKind.TOOL, message=_failure_text(event, error))
            self._connection.send_delegate_response(event.call_id, failure)
        self._flush()


def _failure_text(event: DelegateRequested, error: BaseException) -> str:
    if isinstance(event.request, ToolInvoke):
        return tool_failure_message(event.request.invocation.tool_name.name, error)
    return f"code-mode delegate task failed: {error}"


async def _reap(process: trio.Process) -> None:
    """Kill the process if it still runs, close its pipes and wait for it (no zombie, no fd)."""
    if process.returncode is None:
        process.kill()
    for stream in (process.stdin, process.stdout, process.stderr):
        if stream is not None:
            await stream.aclose()
    await process.wait()
