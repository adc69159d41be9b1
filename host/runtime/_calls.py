"""The delegate calls of one cell: its nested tool calls and its notifications.

Each call runs in a worker task of the session's `CallWorkers`, in a `CallbackGroup` (one group
for tool calls, one for notifications), so the cell can cancel them all and wait for them with a
bound.

Rules:
1. A call the cell makes while its observer is answering (the observer is YIELDING) is held
   back until that observer answered (`release_held`), so the observer's response reaches the
   caller, and the wire, before the call does (design.md, host 2.5).
2. A tool's answer reaches the engine only while the cell accepts answers (its JavaScript runs
   and it is not terminating); a late answer is discarded. It goes through `submit`, which
   holds it while the cell is paused at its pending frontier, and is checked again when it
   finally goes.
3. A delegate's `ToolError` rejects the JS promise with its text; anything else it raises
   (`SystemExit` and other `BaseException`s too, all but the call's own cancellation:
   `codemode._trio.contained`), or a result with no JSON form, rejects it with
   `tool <name> failed: <message>`, and nothing else ends.
4. `all_started()` returns once every tool call made so far has reached its delegate (its task
   ran its first step): a pending frontier is delivered only after the delegate saw each call it
   lists, so an application can settle them (over the wire: each call's frame goes first).
5. Each call holds a pending-call slot of the connection's `Admission` from when the cell makes
   it until its task ends (or it is dropped unstarted). A tool call past the bound, or past the
   session's tool call budget (`_budget`, checked first; a call that passes both counts
   against it), is rejected at once with its text (`code-mode host has too many pending
   delegate calls`, `session tool call budget of N calls is used up`) and never reaches the
   delegate; a notification past it is dropped, and logged once per cell (the first drop, then
   their count when the cell closes: a `notify()` loop must not flood the log).
6. A delegate that is a `ToolForwarder` (the host's, which only sends the call over the wire)
   gets its tool calls without a task: `forward_tool` sends the call and returns how to cancel
   it; its answer comes back through a callback. Such a call has started once it is forwarded
   (rule 4), and is over once cancelled (nothing to wait for); rules 2, 3 and 5 hold alike.
   (A task per call, its cancel scope and its two passes of the scheduler were a third of the
   host's work per nested tool call.)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from functools import partial
from typing import Protocol, cast

import msgspec
import trio
from codemode_host.engine import EngineCell, EngineClosedError, ToolCallRequested

from codemode import ExecuteRequest, JsonValue, NestedToolCall, SessionDelegate, ToolError
from codemode._governance import approval_reporter
from codemode._trio import CLEANUP_GRACE, CallbackGroup, CallWorkers, contained
from codemode.errors import TOO_MANY_CALLS, ToolDeniedError, tool_failure_message

from ._admission import Admission
from ._budget import SessionBudget

logger = logging.getLogger("codemode.runtime")

_encode_json = msgspec.json.Encoder().encode
_decode_json = msgspec.json.Decoder().decode


def _refuse() -> bool:
    return False


_Result = tuple[bytes, bool]
"""A tool's result as the engine takes it: (UTF-8 bytes, whether they are the text of a string
result rather than JSON text)."""


def _encode_result(result: JsonValue) -> _Result:
    """A string result goes to the cell as its text, without JSON (a large text, a file's
    contents say, cost an escaping pass here and a parse in the cell); any other value as JSON
    text.

    Raises:
        TypeError, ValueError, OverflowError: no JSON text for it (a lone surrogate in a string
            is a ValueError, as when it is inside a value).
    """
    if isinstance(result, str):
        return result.encode(), True
    return _encode_json(result), False


ToolAnswer = Callable[[JsonValue, str | None, bool], None]
"""A forwarded call's outcome: (result, None, False) resolves its promise, (None, text, False)
rejects it with the text, (None, text, True) with an `Error` of that message (denied)."""


class ToolForwarder(Protocol):
    """A delegate that sends tool calls on instead of running them (rule 6)."""

    def forward_tool(self, call: NestedToolCall, answer: ToolAnswer) -> Callable[[], None]:
        """Send `call` on; `answer` runs once with its outcome (possibly before this returns),
        unless the returned cancel ran first."""
        ...


def _not_yet() -> None:
    """The cancel of a forwarded call while it is being sent (its own is not known yet)."""


class CellCalls:
    """The tool calls and notifications of one cell.

    Args:
        cell_id: the cell's id, as the delegate sees it.
        request: the execute request (its tools and its `tool_call_id`).
        delegate: who runs the calls.
        engine_cell: where tool answers go.
        workers: where the calls run (the session's).
        accepting: whether a tool answer may still reach the engine (rule 2).
        submit: runs a command for the engine now, or later if the cell is paused.
        admission: where the calls take their pending-call slots (rule 5).
        budget: the session's budget the tool calls count against (rule 5).
        timed: measure each tool call's round trip (`round_trips_ns`), for the cell's report.
    """

    def __init__(
        self,
        *,
        cell_id: str,
        request: ExecuteRequest,
        delegate: SessionDelegate,
        engine_cell: EngineCell,
        workers: CallWorkers,
        accepting: Callable[[], bool],
        submit: Callable[[Callable[[], None]], None],
        admission: Admission,
        budget: SessionBudget,
        timed: bool = False,
    ) -> None:
        self._cell_id = cell_id
        self._request = request
        self._delegate = delegate
        self._engine_cell = engine_cell
        self._accepting = accepting
        self._submit = submit
        self._admission = admission
        self._budget = budget
        self.pending_tools = 0
        """Tool calls made and not answered yet (held ones included)."""
        self._tools = CallbackGroup(workers)
        forwards = callable(getattr(delegate, "forward_tool", None))
        self._forwarder = cast(ToolForwarder, delegate) if forwards else None
        self._forwarded: dict[int, Callable[[], None]] = {}  # call id -> its cancel (rule 6)
        self._notifications = CallbackGroup(workers)
        self._held: list[tuple[Callable[[], object], bool]] = []  # (start, is a tool call)
        self._dropped_notifications = 0  # rule 5
        self._released: trio.Event | None = None  # made when calls are first held
        self.on_approval: Callable[[str, bool], None] | None = None
        """Told when a call this runs starts or stops waiting for approval (`tool-N`, waiting):
        the delegate reports it through `approval_reporter` (rule 6 of `_governance`)."""
        self.pending_changed: Callable[[], None] | None = None
        """Told when `pending_tools` changes, while the cell wants to know (its approvals)."""
        # With `timed` (the cell's telemetry wants them): when each call was made, and each
        # answered call's round trip, in nanoseconds.
        self._made_ns: dict[int, int] | None = {} if timed else None
        self.round_trips_ns: list[int] = []

    # ---- starting ------------------------------------------------------------------------

    def tool_call(self, event: ToolCallRequested, *, hold: bool) -> bool:
        """Start (or hold back, rule 1) the call a cell made; False if it was refused (rule 5:
        its promise is rejected)."""
        refusal = self._budget.tool_call_refusal()
        if refusal is not None:
            self._answer(event.call_id, rejection=refusal)
            return False
        if not self._admission.take_call():
            self._answer(event.call_id, rejection=TOO_MANY_CALLS)
            return False
        self._budget.tool_calls += 1
        definition = self._request.enabled_tools[event.tool_index]
        call = NestedToolCall(
            cell_id=self._cell_id,
            runtime_tool_call_id=f"tool-{event.call_id}",
            tool_name=definition.tool_name,
            tool_kind=definition.kind,
            input=None if event.input_json is None else _decode_json(event.input_json),
        )
        self.pending_tools += 1
        if self.pending_changed is not None:
            self.pending_changed()
        if self._made_ns is not None:
            self._made_ns[event.call_id] = time.time_ns()
        if self._forwarder is not None:
            self._start(lambda: self._forward_tool(event.call_id, call), hold, True)
        else:
            self._start(
                lambda: self._tools.start(self._invoke_tool, event.call_id, call), hold, True
            )
        return True

    async def all_started(self) -> None:
        """Wait until every tool call started so far reached its delegate (rule 4; calls held
        behind a yielding observer start when it answered, before any frontier observer)."""
        await self._tools.all_started()

    def notification(self, text: str, *, hold: bool) -> None:
        """Deliver (or hold back, rule 1) a `notify()` text."""
        if not self._admission.take_call():
            self._dropped_notifications += 1
            if self._dropped_notifications == 1:
                logger.warning(
                    "failed to deliver code mode notification: %s (exec cell %s; its further"
                    " drops are counted when it closes)",
                    TOO_MANY_CALLS,
                    self._cell_id,
                )
            return
        self._start(
            partial(self._notifications.start, self._deliver_notification, text), hold, False
        )

    def _start(self, start: Callable[[], object], hold: bool, tool: bool) -> None:
        if hold or self._held:
            if not self._held:
                self._released = trio.Event()
            self._held.append((start, tool))  # behind earlier held ones: the cell's order is kept
        else:
            start()

    def release_held(self) -> None:
        """The observer answered: start the calls held back behind it, in order."""
        held, self._held = self._held, []
        for start, _ in held:
            start()
        if self._released is not None:
            self._released.set()

    # ---- ending ------------------------------------------------------------------------

    @property
    def notifications_delivered(self) -> bool:
        """No notification is held back or in flight."""
        return not self._held and self._notifications.idle

    @property
    def idle(self) -> bool:
        """No call is running (held ones are not counted: they start, or are dropped, when
        their observer answered)."""
        return self._notifications.idle and self._tools.idle

    async def deliver_notifications(self) -> None:
        """Wait until every notification made so far was delivered (or cancelled): the held
        ones start when their observer answered, which it is about to do."""
        if self.notifications_delivered:
            return  # the common case, without a pass of the scheduler (the cell's end waits)
        while self._held:
            assert self._released is not None  # made when the first was held
            await self._released.wait()
        await self._notifications.wait_idle()

    def cancel_tools(self, reason: str) -> None:
        if not self.pending_tools:
            return  # none made, or all answered: the common case at a cell's end
        self._tools.cancel(reason)
        self._cancel_forwarded()

    def _cancel_forwarded(self) -> None:
        forwarded, self._forwarded = self._forwarded, {}
        for cancel in forwarded.values():
            cancel()
            self._tool_ended()

    def cancel(self, reason: str) -> None:
        """Cancel every call; held calls are dropped (the cell ends without them)."""
        if not self._held and not self.pending_tools and self._notifications.idle:
            return  # nothing in flight: the common case at a cell's close
        for _, tool in self._held:  # dropped unstarted: their slots go back now (rule 5)
            self._admission.release_call()
            self.pending_tools -= tool
        self._held.clear()
        if self._released is not None:
            self._released.set()
        self._notifications.cancel(reason)
        self._tools.cancel(reason)
        self._cancel_forwarded()

    def detach(self) -> None:
        """The cell closed: nothing is accepted any more (as `accepting` already answered),
        and this no longer refers to the cell. Its `accepting` closure was a reference cycle
        (the cell holds this), which left every cell's objects to the cyclic collector."""
        self._accepting = _refuse
        self.on_approval = None  # the cell's bound methods: the same cycle
        self.pending_changed = None
        if self._dropped_notifications > 1:
            logger.warning(
                "dropped %d notifications of exec cell %s in all: %s",
                self._dropped_notifications,
                self._cell_id,
                TOO_MANY_CALLS,
            )

    async def wait_idle(self) -> None:
        """Wait until every call returned, for at most `CLEANUP_GRACE` (design.md, design 4)."""
        if self.idle:
            return  # the common case, without a scope or a pass of the scheduler
        with trio.move_on_after(CLEANUP_GRACE):
            await self._notifications.wait_idle()
            await self._tools.wait_idle()

    # ---- running -----------------------------------------------------------------------

    def _tool_ended(self) -> None:
        self._admission.release_call()
        self.pending_tools -= 1
        if self.pending_changed is not None:
            self.pending_changed()

    def _forward_tool(self, call_id: int, call: NestedToolCall) -> None:
        assert self._forwarder is not None
        self._forwarded[call_id] = _not_yet
        answer = partial(self._forwarded_answer, call_id, call.tool_name.name)
        cancel = self._forwarder.forward_tool(call, answer)
        if call_id in self._forwarded:  # not answered at once
            self._forwarded[call_id] = cancel

    def _forwarded_answer(
        self,
        call_id: int,
        tool_name: str,
        result: JsonValue,
        rejection: str | None,
        as_error: bool = False,
    ) -> None:
        if self._forwarded.pop(call_id, None) is None:
            return  # cancelled first: a late answer is dropped
        self._tool_ended()
        if rejection is not None:
            self._answer(call_id, rejection=rejection, as_error=as_error)
            return
        try:
            payload = _encode_result(result)
        except (TypeError, ValueError, OverflowError) as error:
            self._answer(call_id, rejection=tool_failure_message(tool_name, error))
            return
        self._answer(call_id, result=payload)

    async def _invoke_tool(self, call_id: int, call: NestedToolCall) -> None:
        try:
            await self._run_tool(call_id, call)
        finally:
            self._tool_ended()

    async def _run_tool(self, call_id: int, call: NestedToolCall) -> None:
        reporter = None
        if self.on_approval is not None:
            reporter = approval_reporter.set(partial(self.on_approval, call.runtime_tool_call_id))
        try:
            result = await self._delegate.invoke_tool(call)
            payload = _encode_result(result)
        except ToolError as refusal:
            denied = isinstance(refusal, ToolDeniedError)
            self._answer(call_id, rejection=refusal.text, as_error=denied)
        except BaseException as error:
            if not contained(error):
                raise  # the call's own cancellation
            if not isinstance(error, TypeError | ValueError | OverflowError):
                logger.warning("tool %s of exec cell %s raised", call.tool_name.name,
                               self._cell_id, exc_info=True)  # fmt: skip
            self._answer(call_id, rejection=tool_failure_message(call.tool_name.name, error))
        else:
            self._answer(call_id, result=payload)
        finally:
            if reporter is not None:
                approval_reporter.reset(reporter)  # the worker task runs other calls next

    def _answer(
        self,
        call_id: int,
        *,
        result: _Result | None = None,
        rejection: str | None = None,
        as_error: bool = False,
    ) -> None:
        if self._made_ns is not None and (made := self._made_ns.pop(call_id, None)):
            self.round_trips_ns.append(time.time_ns() - made)
        if self._accepting():
            self._submit(lambda: self._settle(call_id, result, rejection, as_error))

    def _settle(
        self, call_id: int, result: _Result | None, rejection: str | None, as_error: bool
    ) -> None:
        if not self._accepting():
            return  # rule 2: a late answer for a cell that ended is discarded
        try:
            if result is not None:
                payload, is_text = result
                if is_text:
                    self._engine_cell.settle_tool_call_with_text(call_id, payload)
                else:
                    self._engine_cell.settle_tool_call(call_id, payload)
            else:
                assert rejection is not None
                if as_error:
                    self._engine_cell.reject_tool_call_with_error(call_id, rejection)
                else:
                    self._engine_cell.reject_tool_call(call_id, rejection)
        except EngineClosedError:
            pass  # the engine is closing: the cell is about to end anyway

    async def _deliver_notification(self, text: str) -> None:
        try:
            await self._delegate.notify(self._request.tool_call_id, self._cell_id, text)
        except BaseException as error:
            if not contained(error):
                raise  # the call's own cancellation
            logger.warning("failed to deliver code mode notification: %s", error)
        finally:
            self._admission.release_call()
