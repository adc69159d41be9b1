"""One cell of a session: its task, its output, its observers and its delegate calls.

The cell task drives an engine cell through the turn-and-event interface (no thread hand-off
per turn): it turns engine events into output items, delegate calls and timers, and takes the
cell through its phases:

    RUNNING ──(JS ends)──> drain notifications, cancel tool calls, commit stored values
       │                   └──> COMPLETED (buffered) ──(observed or claimed)──> CLOSED
       └──(terminate / shutdown)──> TERMINATING ──(turn over, calls cancelled)──> CLOSED

Rules (reference-runtime section 5):
1. Termination interrupts the engine first, then awaits the end of the running turn, then
   cancels tool calls and notifications and waits for them (at most CLEANUP_GRACE), then hands
   `Terminated` to the terminator and to any pending observer.
2. Stored values are merged into the session only at natural completion (a throw and `exit()`
   included), never after termination or shutdown.
3. A completion nobody observes stays buffered: the next `wait` gets it at once, and a
   `terminate` claims it instead of terminating.
4. `cell_closed` runs exactly once, last, after the cell left the session's registry.
"""

from __future__ import annotations

import enum
import logging
import math
from collections.abc import Callable

import msgspec
import trio
from codemode_host.engine import (
    CellEvent,
    EngineCell,
    EngineClosedError,
    Finished,
    ImageOutput,
    Notification,
    Outcome,
    Started,
    StoredValueWritten,
    TextOutput,
    TimerCleared,
    TimerStarted,
    ToolCallRequested,
    YieldRequested,
)

from codemode import (
    Completed,
    ContentItem,
    ExecuteRequest,
    ImageDetail,
    InputImage,
    InputText,
    LiveCell,
    NestedToolCall,
    RuntimeResponse,
    SessionDelegate,
    Terminated,
    ToolError,
    WaitOutcome,
    Yielded,
)
from codemode._callbacks import CLEANUP_GRACE, CallbackGroup
from codemode.errors import (
    AlreadyTerminatingError,
    CodeModeError,
    ObserverBusyError,
    RuntimeEndedError,
    tool_failure_message,
)

from ._observer import Observer

logger = logging.getLogger("codemode.runtime")

_encode_json = msgspec.json.Encoder().encode
_decode_json = msgspec.json.Decoder().decode


class Phase(enum.Enum):
    RUNNING = "running"
    COMPLETED = "completed"
    TERMINATING = "terminating"
    CLOSED = "closed"


class RuntimeCell:
    """A cell's state and task. Created and registered by `RuntimeSession.execute`."""

    def __init__(
        self,
        *,
        cell_id: str,
        request: ExecuteRequest,
        delegate: SessionDelegate,
        engine_cell: EngineCell,
        nursery: trio.Nursery,
        commit: Callable[[dict[str, bytes]], None],
        forget: Callable[[str], None],
        initial_window_ms: int,
    ) -> None:
        self.cell_id = cell_id
        self.phase = Phase.RUNNING
        self.closed = trio.Event()
        self._request = request
        self._delegate = delegate
        self._engine_cell = engine_cell
        self._commit = commit
        self._forget = forget
        self._tools = CallbackGroup(nursery)
        self._notifications = CallbackGroup(nursery)
        self._timers: dict[int, trio.CancelScope] = {}
        self._js_running = True
        self._content: list[ContentItem] = []
        self._writes: dict[str, bytes] = {}
        self._initial_observer: Observer | None = Observer(initial_window_ms, start_now=False)
        self._observer: Observer | None = self._initial_observer
        self._completion_error: str | None = None
        self._completion_claimed = trio.Event()  # set once an observer or terminate took it
        self._terminated: Terminated | None = None

    # ---- observation ---------------------------------------------------------------------

    def attach(self, window_ms: int) -> Observer:
        """A new observation whose window starts now; the cell must have no other observer."""
        if self._observer is not None:
            raise ObserverBusyError(self.cell_id)
        observer = Observer(window_ms, start_now=True)
        self._observer = observer
        return observer

    async def initial_response(self) -> RuntimeResponse:
        """The observation that `execute` attached, awaited by `StartedCell.initial_response`."""
        observer = self._initial_observer
        if observer is None:
            raise CodeModeError(
                f"the initial response of exec cell {self.cell_id} was already taken"
            )
        if self._observer is not observer:
            if self._observer is not None:
                raise ObserverBusyError(self.cell_id)
            self._observer = observer
        response = await self.observe(observer)
        self._initial_observer = None
        return response

    def release_initial_observer(self) -> None:
        """The `StartedCell` was dropped unawaited: later `wait`s may observe."""
        if self._initial_observer is not None and self._observer is self._initial_observer:
            self._observer = None
        self._initial_observer = None

    async def observe(self, observer: Observer) -> RuntimeResponse:
        """Wait for the observation's end and build its response (rule 1 of `_observer`).

        Raises:
            RuntimeEndedError: the cell closed without answering this observation.
        """
        try:
            await trio.lowlevel.checkpoint_if_cancelled()
            while True:
                response = self._response_for(observer)
                if response is not None:
                    return response
                deadline = math.inf
                if self.phase is Phase.RUNNING and observer.deadline is not None:
                    deadline = observer.deadline
                observer.wake = trio.Event()
                with trio.move_on_at(deadline):
                    await observer.wake.wait()
        finally:
            if self._observer is observer:
                self._observer = None

    def _response_for(self, observer: Observer) -> RuntimeResponse | None:
        if self._terminated is not None:
            return self._terminated
        if self.phase is Phase.CLOSED:
            raise RuntimeEndedError()
        if self.phase is Phase.TERMINATING:
            return None
        if observer.boundary is not None:
            return self._yielded(observer.boundary)
        if self.phase is Phase.COMPLETED:
            # Claimed by a terminate: this observation ends when the cell closes.
            return None if self._completion_claimed.is_set() else self._take_completion()
        if observer.expired(trio.current_time()):
            return self._yielded(len(self._content))
        return None

    def _yielded(self, count: int) -> Yielded:
        items = self._content[:count]
        del self._content[:count]
        return Yielded(cell_id=self.cell_id, content_items=items)

    def _take_completion(self) -> Completed:
        self._completion_claimed.set()
        items, self._content = self._content, []
        return Completed(
            cell_id=self.cell_id, content_items=items, error_text=self._completion_error
        )

    def _wake_observer(self) -> None:
        if self._observer is not None:
            self._observer.wake.set()

    # ---- termination -----------------------------------------------------------------------

    async def terminate(self) -> WaitOutcome:
        """Stop the cell; its buffered completion, if it has one, is returned instead."""
        if self.phase is Phase.COMPLETED and not self._completion_claimed.is_set():
            return LiveCell(response=self._take_completion())
        if self.phase is not Phase.RUNNING:
            raise AlreadyTerminatingError(self.cell_id)
        self._begin_termination("terminated")
        await self.closed.wait()
        if self._terminated is None:
            raise RuntimeEndedError()
        return LiveCell(response=self._terminated)

    def begin_shutdown(self) -> None:
        """Terminate the cell for a session shutdown; a buffered completion is dropped."""
        if self.phase is Phase.RUNNING:
            self._begin_termination("session shut down")
        elif self.phase is Phase.COMPLETED:
            self._completion_claimed.set()

    def _begin_termination(self, reason: str) -> None:
        self.phase = Phase.TERMINATING
        if self._js_running:
            self._engine_cell.interrupt()
        self._notifications.cancel(reason)
        self._tools.cancel(reason)
        self._wake_observer()

    # ---- the cell task ---------------------------------------------------------------------

    async def run(self) -> None:
        """The cell's task: run the JavaScript, finish the cell, close it."""
        try:
            finished = await self._run_javascript()
            if self.phase is Phase.RUNNING:
                if finished.outcome is Outcome.INTERRUPTED:
                    # Interrupted without a termination: the engine is shutting down.
                    self._writes.clear()
                    finished = Finished(Outcome.ERROR, "exec runtime ended unexpectedly")
                await self._finish_naturally(finished.error_text)
            if self.phase is Phase.TERMINATING:
                await self._finish_terminated()
        finally:
            self._close()

    async def _run_javascript(self) -> Finished:
        async with trio.open_nursery() as timers:
            try:
                while True:
                    events = await self._engine_cell.next_events()
                    now = trio.current_time()
                    for event in events:
                        if isinstance(event, Finished):
                            return event
                        self._handle(event, now, timers)
            finally:
                self._js_running = False
                timers.cancel_scope.cancel()
        raise AssertionError("unreachable")  # pragma: no cover

    def _handle(self, event: CellEvent, now: float, timers: trio.Nursery) -> None:
        observer = self._observer
        if observer is not None and observer.boundary is None and observer.expired(now):
            # The window ended before this event: the observation yields without it.
            observer.mark_boundary(len(self._content))
        match event:
            case TextOutput(text=text):
                self._content.append(InputText(text=text))
            case ImageOutput(image_url=url, detail=detail):
                self._content.append(InputImage(image_url=url, detail=ImageDetail(detail)))
            case ToolCallRequested():
                self._start_tool_call(event)
            case Notification(text=text):
                self._notifications.start(self._deliver_notification, text)
            case StoredValueWritten(key=key, value_json=value):
                self._writes[key] = value
            case YieldRequested():
                if observer is not None:
                    observer.mark_boundary(len(self._content))
            case TimerStarted(timer_id=timer_id, delay_ms=delay_ms):
                scope = trio.CancelScope()
                self._timers[timer_id] = scope
                timers.start_soon(self._run_timer, timer_id, delay_ms, scope)
            case TimerCleared(timer_id=timer_id):
                cleared = self._timers.pop(timer_id, None)
                if cleared is not None:
                    cleared.cancel()
            case Started():
                if observer is not None:
                    observer.start_window(now)
                    if observer.expired(now):
                        observer.mark_boundary(len(self._content))
                    observer.wake.set()

    async def _run_timer(self, timer_id: int, delay_ms: int, scope: trio.CancelScope) -> None:
        with scope:
            await trio.sleep(delay_ms / 1000)
            self._timers.pop(timer_id, None)
            if self._js_running:
                self._engine_cell.fire_timer(timer_id)

    async def _finish_naturally(self, error_text: str | None) -> None:
        # Notifications in flight are delivered (a termination meanwhile cancels them), then
        # tool calls still pending are cancelled: their results can no longer matter.
        await self._notifications.wait_idle()
        self._tools.cancel("the cell completed")
        with trio.move_on_after(CLEANUP_GRACE):
            await self._tools.wait_idle()
        if self.phase is not Phase.RUNNING:
            return
        self._commit(self._writes)
        self._completion_error = error_text
        self.phase = Phase.COMPLETED
        self._wake_observer()
        await self._completion_claimed.wait()

    async def _finish_terminated(self) -> None:
        with trio.move_on_after(CLEANUP_GRACE):
            await self._notifications.wait_idle()
            await self._tools.wait_idle()
        items, self._content = self._content, []
        self._terminated = Terminated(cell_id=self.cell_id, content_items=items)
        self._wake_observer()

    def _close(self) -> None:
        self._js_running = False
        self._engine_cell.close()
        self._notifications.cancel("the cell closed")
        self._tools.cancel("the cell closed")
        self.phase = Phase.CLOSED
        self._forget(self.cell_id)
        self._wake_observer()
        self.closed.set()
        try:
            self._delegate.cell_closed(self.cell_id)
        except Exception:
            logger.exception("cell_closed(%r) raised", self.cell_id)

    # ---- delegate calls --------------------------------------------------------------------

    def _start_tool_call(self, event: ToolCallRequested) -> None:
        definition = self._request.enabled_tools[event.tool_index]
        call = NestedToolCall(
            cell_id=self.cell_id,
            runtime_tool_call_id=f"tool-{event.call_id}",
            tool_name=definition.tool_name,
            tool_kind=definition.kind,
            input=None if event.input_json is None else _decode_json(event.input_json),
        )
        self._tools.start(self._invoke_tool, event.call_id, call)

    async def _invoke_tool(self, call_id: int, call: NestedToolCall) -> None:
        try:
            result = await self._delegate.invoke_tool(call)
            payload = _encode_json(result)
        except ToolError as error:
            self._answer_tool(call_id, rejection=error.text)
        except Exception as error:
            if not isinstance(error, TypeError | ValueError | OverflowError):
                logger.warning("tool %s of exec cell %s raised", call.tool_name.name,
                               self.cell_id, exc_info=True)  # fmt: skip
            self._answer_tool(call_id, rejection=tool_failure_message(call.tool_name.name, error))
        else:
            self._answer_tool(call_id, result_json=payload)

    def _answer_tool(
        self, call_id: int, *, result_json: bytes | None = None, rejection: str | None = None
    ) -> None:
        if not self._js_running or self.phase is not Phase.RUNNING:
            return  # a late answer for a cell that ended is discarded
        try:
            if rejection is None:
                assert result_json is not None
                self._engine_cell.settle_tool_call(call_id, result_json)
            else:
                self._engine_cell.reject_tool_call(call_id, rejection)
        except EngineClosedError:
            pass  # the engine is closing: the cell is about to end anyway

    async def _deliver_notification(self, text: str) -> None:
        try:
            await self._delegate.notify(self._request.tool_call_id, self.cell_id, text)
        except Exception as error:
            logger.warning("failed to deliver code mode notification: %s", error)
