"""One cell of a session: its output, its observers, its delegate calls and, when it needs one,
its task.

The cell drives an engine cell through the turn-and-event interface (no thread hand-off per
turn): its handler turns engine events into output items, delegate calls and timers. Its state lives
in two tables (`_phases`): the lifecycle (running, draining notifications, completed, claimed,
terminating, terminated, closed) and the observation (idle, watching, yielding); every change
goes through them.

Rules (design.md, runtime 5):
1. Termination interrupts the engine first, then awaits the end of the running turn, then
   cancels tool calls and notifications and waits for them (at most CLEANUP_GRACE), then hands
   `Terminated` to the terminator and to any pending observer.
2. Stored values are merged into the session only at natural completion (a throw and `exit()`
   included), never after termination or shutdown.
3. A completion nobody observes stays buffered: the next `wait` gets it at once, and a
   `terminate` claims it instead of terminating.
4. `cell_closed` runs exactly once, last, after the cell left the session's registry. Who
   takes the completion closes the cell: an observer before it returns (design.md, runtime 5.4,
   step 6), a terminate a pass later, a shutdown. Else its task closes it, or on an abort the
   watch (`_watch`, rule 10).
5. The initial observation belongs to the `StartedCell`: awaited once, or released (explicitly,
   by `execute(..., observe_initial=False)`, when its await is cancelled, or when the
   `StartedCell` is dropped, which warns); after that, `wait`s observe the cell and nothing
   the initial observation did not take is lost.
6. Frontier observers (`_frontier`) see the cell's quiescence; tool answers and timer firings
   reach the engine through the frontier, which holds them while the cell is paused.
7. The cell is admitted holding an active-cell slot (`_admission`) and gives it back when its
   lifecycle leaves the ACTIVE states, in `_move`, the one place its lifecycle changes, which
   also keeps the session's count of uncollected completions.
8. The engine's events, `Finished` included, are handled in the collector's step
   (`EngineCell.handle_events`): a cell with no call left to wait for completes there.
9. The cell's deadlines are alarms of the engine (`_jswait`) while its JavaScript runs: its
   observer's window end (rule 6 of `_observer`), its wall-clock limit, and after a
   termination the moment its turn is abandoned. Past its wall-clock limit
   (`CellLimits.max_wall_time_ms`, counted from its admission, less the time it was paused by
   `pause_deadline`) a running cell's JavaScript is interrupted, and the cell then completes
   as the CPU limit makes it: `Completed` with `exec cell exceeded its time limit of N ms`,
   its output kept, its tool calls cancelled and waited for (rule 1's grace), its stored-value
   writes dropped (rule 2).
10. A cell gets a task (`run`) only to wait itself: for the calls in flight when its
   JavaScript ended, for a termination, or to raise its handler's exception. Running, waiting
   and holding a completion need none (a task per cell cost a sixth of the host's
   instructions for a trivial cell, and memory for every waiting one).
11. A cell made with `report_to` records its life (`CellReport`: a few wall-clock stamps and
   counts, never its source or payloads) and hands the report to `report_to` at its close,
   just before `cell_closed`; without it the cell records nothing but its turn count.
12. The cell counts its tool calls (`_calls`, rule 5) and its CPU time against the session's
   budget (`_budget`) as the engine reports them: at each `Idle` and at `Finished`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Final

import trio
from codemode_host.engine import (
    CellEvent,
    EngineCell,
    Finished,
    Idle,
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
    CellInfo,
    Completed,
    ExecuteRequest,
    LiveCell,
    SessionDelegate,
    Terminated,
    WaitOutcome,
)
from codemode.errors import (
    AlreadyTerminatingError,
    RuntimeEndedError,
    time_limit_exceeded,
)
from codemode.observability import CellReport

from ._callee import name_the_callee
from ._calls import CellCalls
from ._frontier import Frontier
from ._jswait import JavaScriptWait
from ._life import Life
from ._observer import InitialObservation, Observer, item_bytes
from ._output import CellOutput
from ._phases import (
    ACTIVE,
    LIFECYCLE,
    Lifecycle,
    LifecycleTrigger,
    Watch,
)
from ._share import CellShare
from ._timers import CellTimers
from ._watched import WatchedCell

logger = logging.getLogger("codemode.runtime")

# The engine's events of every cell, matched by their exact class (`Final`: C statics compiled).
# The engine makes exactly these classes, and a failed `isinstance` against a msgspec class
# costs the compiled build about 600 instructions: a `match` took about 30 of them a tool cell.
_STARTED: Final = Started
_TEXT_OUTPUT: Final = TextOutput
_TOOL_CALL_REQUESTED: Final = ToolCallRequested
_IDLE: Final = Idle
_FINISHED: Final = Finished


class RuntimeCell(WatchedCell):
    """A cell's state, and its task when it needs one (rule 10); its observation half is
    `WatchedCell`'s (`_watched`). Created and registered by `RuntimeSession.execute`, which
    then `start`s it."""

    def __init__(
        self,
        *,
        cell_id: str,
        request: ExecuteRequest,
        delegate: SessionDelegate,
        engine_cell: EngineCell,
        initial_window_ms: int | None,
        share: CellShare,
        report_to: Callable[[CellReport], None] | None = None,
    ) -> None:
        self.cell_id = cell_id
        self.lifecycle = Lifecycle.RUNNING
        self.watch = Watch.WATCHING  # by the initial observer
        self.closed = trio.Event()
        self._source = request.source
        self._delegate = delegate
        self._engine_cell = engine_cell
        self._share = share
        self._holds_slot = True  # rule 7: the session took it when it admitted the cell
        self._admitted_at = share.now()
        self._cpu_us = 0  # as the engine last reported it (rule 12)
        self._cpu_time_ms = 0.0
        self._time_is_up = False  # its wall-clock limit interrupted it (rule 9)
        # An initial observer without a window is `execute_to_pending`'s.
        self._frontier = Frontier(engine_cell, mode=initial_window_ms is None)
        self._calls = CellCalls(
            cell_id=cell_id,
            request=request,
            delegate=delegate,
            engine_cell=engine_cell,
            workers=share.workers,
            accepting=lambda: self._js_running and self.lifecycle is Lifecycle.RUNNING,
            submit=self._frontier.submit,
            admission=share.admission,
            budget=share.budget,
            timed=report_to is not None,
        )
        self._timers = CellTimers(share.alarms, self._frontier.submit)
        self._js_running = True
        self._output = CellOutput(cell_id, engine_cell, share.max_response_bytes)
        self._writes: dict[str, bytes] = {}
        self.initial = InitialObservation(initial_window_ms)
        """The observation `execute` attached (rule 5): the host starts its task when it is
        first woken (`start_when_woken`), and cancels it without trio (`cancel`)."""
        self._observer: Observer | None = self.initial.observer
        self._completion_error: str | None = None
        self._terminated: Terminated | None = None
        self._js_wait = JavaScriptWait(cell_id, engine_cell, share.alarms)
        if share.wall_time_ms is not None:
            self._js_wait.limit_at(self._admitted_at + share.wall_time_ms / 1000, self._time_up)
        self._spawn: Callable[[Callable[[], Awaitable[None]]], None] | None = None
        self._has_task = False
        self._aborted = False
        self._approvals: list[str] = []  # its tool calls waiting for approval (`tool-N`)
        self._paused_for_approval = False
        self._calls.on_approval = self.approval_waiting
        self._turns = 0
        self._report_to = report_to  # rule 11
        if report_to is not None:
            self._life = Life(time.time_ns())

    def start(self, spawn: Callable[[Callable[[], Awaitable[None]]], None]) -> None:
        """Hand the engine's events to the cell's handler, with no task of its own until it
        needs one (rule 10): `spawn(self.run)` then starts it (the session's nursery's
        `start_soon`). A handler that raises gets it a task at once, which raises it."""
        self._spawn = spawn
        self._engine_cell.handle_events(self._handle, self._need_task)

    def _need_task(self) -> None:
        if not self._has_task and self._spawn is not None:
            self._has_task = True
            self._spawn(self.run)

    def abort(self) -> None:
        """The session's nursery was cancelled: close the cell now, unless its task does."""
        self._aborted = True
        if not self._has_task:
            self._close()

    def approval_waiting(self, call_id: str, waiting: bool) -> None:
        """Tool call `call_id` (`tool-N`) started or stopped waiting for its approval in the
        application: `info()` lists it, and the wall-clock limit pauses while every pending
        tool call of the cell waits so (a sibling still running keeps it counting)."""
        if waiting and call_id not in self._approvals:
            self._approvals.append(call_id)
        elif not waiting and call_id in self._approvals:
            self._approvals.remove(call_id)
        self._calls.pending_changed = self._update_pause if self._approvals else None
        self._update_pause()

    def _update_pause(self) -> None:
        waiting = len(self._approvals)
        pause = waiting > 0 and self._calls.pending_tools == waiting
        if pause and not self._paused_for_approval:
            self._paused_for_approval = True
            self.pause_deadline()
        elif not pause and self._paused_for_approval:
            self._paused_for_approval = False
            self.resume_deadline()

    def pause_deadline(self) -> None:
        """Stop counting the cell's wall-clock limit (while it waits for something that is
        not its own doing, an approval say) until `resume_deadline`; nothing without one."""
        self._js_wait.pause_limit()

    def resume_deadline(self) -> None:
        """Count the wall-clock limit again, with the time it had left when paused."""
        self._js_wait.resume_limit()

    def _time_up(self) -> None:
        """The wall-clock limit came (rule 9): interrupt the JavaScript, which then finishes
        `INTERRUPTED`; `_javascript_finished` completes the cell with the limit's text."""
        if self._js_running and self.lifecycle is Lifecycle.RUNNING:
            self._time_is_up = True
            self._frontier.drop()  # answers held at a frontier can no longer matter
            self._engine_cell.interrupt()

    def _count_cpu(self, cpu_us: int) -> None:
        if cpu_us > self._cpu_us:
            self._share.budget.cpu_us += cpu_us - self._cpu_us
            self._cpu_us = cpu_us
            self._cpu_time_ms = cpu_us / 1000

    @property
    def closing(self) -> bool:
        """Its end was taken (claimed, or terminated): `closed` is set within a pass."""
        return self.lifecycle in (Lifecycle.CLAIMED, Lifecycle.TERMINATED)

    def info(self, now: float) -> CellInfo:
        """What the cell holds, for `RuntimeSession.cells()` (`now`: trio's clock)."""
        return CellInfo(
            cell_id=self.cell_id,
            phase=self.lifecycle.value,
            age_s=max(0.0, now - self._admitted_at),
            pending_tool_calls=self._calls.pending_tools,
            buffered_output_bytes=self._output.size,
            cpu_time_ms=self._cpu_time_ms,  # as of the end of its last turn
            waiting_for_approval=list(self._approvals),
        )

    def _move(self, trigger: LifecycleTrigger) -> None:
        left = self.lifecycle
        self.lifecycle = LIFECYCLE.move(left, trigger)
        if self.lifecycle is Lifecycle.COMPLETED:
            self._share.uncollected += 1
        elif left is Lifecycle.COMPLETED:
            self._share.uncollected -= 1
        if self._holds_slot and self.lifecycle not in ACTIVE:
            self._holds_slot = False
            self._share.admission.release_cell()

    # ---- termination -----------------------------------------------------------------------

    async def terminate(self) -> WaitOutcome:
        """Stop the cell; its buffered completion, if it has one, is returned instead."""
        if self.lifecycle is Lifecycle.COMPLETED:
            completion = self._take_completion(None)
            assert isinstance(completion, Completed)
            # Taken: a terminate meanwhile finds it claimed (design.md, runtime 5.5).
            await trio.lowlevel.cancel_shielded_checkpoint()
            if not self._has_task:
                self._close()
            return LiveCell(response=completion)
        if self.lifecycle not in (Lifecycle.RUNNING, Lifecycle.DRAINING):
            await trio.lowlevel.checkpoint()
            raise AlreadyTerminatingError(self.cell_id)
        self._begin_termination("terminated")
        await self.closed.wait()
        if self._terminated is None:
            raise RuntimeEndedError()
        return LiveCell(response=self._terminated)

    def begin_shutdown(self, reason: str = "session shut down") -> None:
        """Terminate the cell for a session shutdown, or because the caller that alone knew
        its id went away (`reason` "terminated"); a buffered completion is dropped."""
        if self.lifecycle in (Lifecycle.RUNNING, Lifecycle.DRAINING):
            self._begin_termination(reason)
        elif self.lifecycle is Lifecycle.COMPLETED:
            self._move(LifecycleTrigger.CLAIM)
            if not self._has_task:
                self._close()

    def _begin_termination(self, reason: str) -> None:
        if self._report_to is not None:
            self._life.outcome = "shutdown" if reason == "session shut down" else "terminated"
        self._move(LifecycleTrigger.TERMINATE)
        self._frontier.drop()
        if self._js_running:
            self._engine_cell.interrupt()
            self._js_wait.abandon_soon()
        self._calls.cancel(reason)
        self._wake_observer()
        self._need_task()

    # ---- the cell task ---------------------------------------------------------------------

    async def run(self) -> None:
        """The cell's task, when it needs one (rule 10): wait for the JavaScript, finish the
        cell, and close it, unless it holds its completion: it then ends, and the claimer
        closes the cell (rule 4)."""
        self._has_task = True
        try:
            await self._run_javascript()
            if self.lifecycle is Lifecycle.DRAINING:
                await self._finish_naturally()
            if self.lifecycle is Lifecycle.TERMINATING:
                await self._finish_terminated()
        finally:
            if self.lifecycle is Lifecycle.COMPLETED and not self._aborted:
                self._has_task = False
            else:
                self._close()

    async def _run_javascript(self) -> None:
        """Take the handling of the engine's events over until the JavaScript ended (its
        `Finished` handled, perhaps before the task began), or until a terminated turn is
        abandoned (rule 9)."""
        try:
            await self._js_wait.run(self._handle)
        finally:
            self._js_running = False
            self._timers.cancel_all()

    def _handle(self, event: CellEvent) -> None:
        now = self._share.now()
        observer = self._observer
        if observer is not None and observer.boundary is None and observer.expired(now):
            # The window ended before this event: the observation yields without it.
            self._mark_boundary(observer)
        if type(event) is _STARTED:
            self._started(event, observer, now)
        elif type(event) is _TEXT_OUTPUT:
            self._add_output(event)
        elif type(event) is _TOOL_CALL_REQUESTED:
            if self._calls.tool_call(event, hold=self.watch is Watch.YIELDING):
                self._frontier.issued(f"tool-{event.call_id}")
        elif type(event) is _IDLE:
            self._count_cpu(event.cpu_us)
            self._turns += 1
            if self._frontier.reached(event) and observer is not None:
                observer.notify()
        elif type(event) is _FINISHED:
            self._javascript_finished(event)
        else:
            self._handle_other(event, observer)

    def _handle_other(self, event: CellEvent, observer: Observer | None) -> None:
        """The events `_handle` does not match by their exact class."""
        match event:
            case ImageOutput():
                self._add_output(event)
            case Notification(text=text):
                self._calls.notification(text, hold=self.watch is Watch.YIELDING)
            case StoredValueWritten(key=key, value_json=value):
                self._writes[key] = value
            case YieldRequested():
                if self._report_to is not None:
                    self._life.yields_ns.append(time.time_ns())
                if observer is not None and not observer.frontier:
                    self._mark_boundary(observer)
            case TimerStarted(timer_id=timer_id, delay_ms=delay_ms):
                self._timers.start(timer_id, delay_ms, self._fire_timer)
            case TimerCleared(timer_id=timer_id):
                self._timers.clear(timer_id)

    def _add_output(self, event: TextOutput | ImageOutput) -> None:
        item = self._output.add(event)
        if self._report_to is not None:
            self._life.output_bytes += item_bytes(item)

    def _started(self, event: Started, observer: Observer | None, now: float) -> None:
        if self._report_to is not None:
            self._life.started_ns = time.time_ns()
            self._life.setup_ns = event.setup_ns
        if observer is not None:
            observer.start_window(now)
            if observer.expired(now):
                self._mark_boundary(observer)
            elif self.lifecycle is Lifecycle.RUNNING:
                self._js_wait.wake_at(observer.deadline, self._wake_observer)

    def _fire_timer(self, timer_id: int) -> None:
        if self._js_running and self.lifecycle is Lifecycle.RUNNING:
            self._engine_cell.fire_timer(timer_id)

    def _javascript_finished(self, finished: Finished) -> None:
        """The handler's `Finished`: the cell drains, and completes at once when no call is
        left to wait for (no pass of the scheduler between its end and its observer)."""
        self._js_running = False
        self._timers.cancel_all()
        self._js_wait.end()
        self._count_cpu(finished.cpu_us)
        if self._report_to is not None:
            self._life.finished(finished, time_is_up=self._time_is_up)
        if self.lifecycle is not Lifecycle.RUNNING:
            return  # terminating: the cell task finishes the termination
        if finished.outcome is Outcome.INTERRUPTED:
            # Interrupted without a termination: its time was up (rule 9), or the engine is
            # shutting down. Cut off either way: nothing is committed.
            self._writes.clear()
            text = "exec runtime ended unexpectedly"
            limit_ms = self._share.wall_time_ms
            if self._time_is_up and limit_ms is not None:
                text = time_limit_exceeded(limit_ms)
            finished = Finished(Outcome.ERROR, text)
        elif finished.outcome is Outcome.CPU_LIMIT:
            self._writes.clear()  # cut off, as a termination is: nothing is committed
        self._move(LifecycleTrigger.JS_FINISHED)
        error_text = finished.error_text
        if error_text is not None:
            error_text = name_the_callee(error_text, self._source)
        self._completion_error = error_text
        if self._calls.notifications_delivered:
            self._calls.cancel_tools("the cell completed")
            if self._calls.idle:
                self._drained()
                return
        self._need_task()  # to wait for the calls in flight (rule 10)

    async def _finish_naturally(self) -> None:
        # Notifications in flight are delivered (a termination meanwhile cancels them), then
        # tool calls still pending are cancelled: their results can no longer matter.
        await self._calls.deliver_notifications()
        self._calls.cancel_tools("the cell completed")
        await self._calls.wait_idle()
        if self.lifecycle is Lifecycle.DRAINING:  # else terminated meanwhile
            self._drained()

    def _drained(self) -> None:
        self._share.commit(self._writes)
        self._move(LifecycleTrigger.DRAINED)
        self._wake_observer()

    async def _finish_terminated(self) -> None:
        await self._calls.wait_idle()
        items = self._output.take_all()
        self._terminated = Terminated(cell_id=self.cell_id, content_items=items)
        self._move(LifecycleTrigger.CLEANED_UP)
        self._wake_observer()

    def _close(self) -> None:
        if self.closed.is_set():
            return  # closed at its claim
        self._js_running = False
        self._js_wait.end()  # an aborted cell's deadlines go with it
        self._engine_cell.close()
        self._calls.cancel("the cell closed")
        self._calls.detach()
        ended = self.lifecycle in (Lifecycle.CLAIMED, Lifecycle.TERMINATED)
        self._move(LifecycleTrigger.CLOSE if ended else LifecycleTrigger.ABORT)
        self._share.forget(self)
        self._wake_observer()
        self.closed.set()
        if self._report_to is not None:
            report = self._life.report(self._turns, self._cpu_time_ms, self._calls.round_trips_ns)
            try:
                self._report_to(report)
            except BaseException:  # as cell_closed's
                logger.exception("the report of exec cell %r failed", self.cell_id)
        try:
            self._delegate.cell_closed(self.cell_id)
        except BaseException:  # also SystemExit: the application's code ends nothing else
            logger.exception("cell_closed(%r) raised", self.cell_id)
