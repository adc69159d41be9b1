"""The delegate calls of one cell: its nested tool calls and its notifications.

Each call runs as a task of the session's nursery in a `CallbackGroup` (one group for tool
calls, one for notifications), so the cell can cancel them all and wait for them with a bound.

Rules:
1. A call the cell makes while its observer is answering (the observer is YIELDING) is held
   back until that observer answered (`release_held`), so the observer's response reaches the
   caller, and the wire, before the call does (reference-host 2.5).
2. A tool's answer reaches the engine only while the cell accepts answers (its JavaScript runs
   and it is not terminating); a late answer is discarded. It goes through `submit`, which
   holds it while the cell is paused at its pending frontier, and is checked again when it
   finally goes.
3. A delegate's `ToolError` rejects the JS promise with its text; any other exception (or a
   result with no JSON form) rejects it with `tool <name> failed: <message>`.
4. `all_started()` returns once every tool call made so far has reached its delegate (its task
   ran its first step): a pending frontier is delivered only after the delegate saw each call it
   lists, so an application can settle them (over the wire: each call's frame goes first).
5. Each call holds a pending-call slot of the connection's `Admission` from when the cell makes
   it until its task ends (or it is dropped unstarted). A tool call past the bound is rejected
   at once with `code-mode host has too many pending delegate calls` and never reaches the
   delegate; a notification past it is logged and dropped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial

import msgspec
import trio
from codemode_host.engine import EngineCell, EngineClosedError, ToolCallRequested

from codemode import ExecuteRequest, NestedToolCall, SessionDelegate, ToolError
from codemode._trio import CLEANUP_GRACE, CallbackGroup
from codemode.errors import TOO_MANY_CALLS, tool_failure_message

from ._admission import Admission

logger = logging.getLogger("codemode.runtime")

_encode_json = msgspec.json.Encoder().encode
_decode_json = msgspec.json.Decoder().decode


class CellCalls:
    """The tool calls and notifications of one cell.

    Args:
        cell_id: the cell's id, as the delegate sees it.
        request: the execute request (its tools and its `tool_call_id`).
        delegate: who runs the calls.
        engine_cell: where tool answers go.
        nursery: where the calls run (the session's).
        accepting: whether a tool answer may still reach the engine (rule 2).
        submit: runs a command for the engine now, or later if the cell is paused.
        admission: where the calls take their pending-call slots (rule 5).
    """

    def __init__(
        self,
        *,
        cell_id: str,
        request: ExecuteRequest,
        delegate: SessionDelegate,
        engine_cell: EngineCell,
        nursery: trio.Nursery,
        accepting: Callable[[], bool],
        submit: Callable[[Callable[[], None]], None],
        admission: Admission,
    ) -> None:
        self._cell_id = cell_id
        self._request = request
        self._delegate = delegate
        self._engine_cell = engine_cell
        self._accepting = accepting
        self._submit = submit
        self._admission = admission
        self.pending_tools = 0
        """Tool calls made and not answered yet (held ones included)."""
        self._tools = CallbackGroup(nursery)
        self._notifications = CallbackGroup(nursery)
        self._held: list[tuple[Callable[[], object], bool]] = []  # (start, is a tool call)
        self._released = trio.Event()

    # ---- starting ------------------------------------------------------------------------

    def tool_call(self, event: ToolCallRequested, *, hold: bool) -> bool:
        """Start (or hold back, rule 1) the call a cell made; False if it was refused (rule 5:
        its promise is rejected)."""
        if not self._admission.take_call():
            self._answer(event.call_id, rejection=TOO_MANY_CALLS)
            return False
        definition = self._request.enabled_tools[event.tool_index]
        call = NestedToolCall(
            cell_id=self._cell_id,
            runtime_tool_call_id=f"tool-{event.call_id}",
            tool_name=definition.tool_name,
            tool_kind=definition.kind,
            input=None if event.input_json is None else _decode_json(event.input_json),
        )
        self.pending_tools += 1
        self._start(lambda: self._tools.start(self._invoke_tool, event.call_id, call), hold, True)
        return True

    async def all_started(self) -> None:
        """Wait until every tool call started so far reached its delegate (rule 4; calls held
        behind a yielding observer start when it answered, before any frontier observer)."""
        await self._tools.all_started()

    def notification(self, text: str, *, hold: bool) -> None:
        """Deliver (or hold back, rule 1) a `notify()` text."""
        if not self._admission.take_call():
            logger.warning("failed to deliver code mode notification: %s", TOO_MANY_CALLS)
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
        self._released.set()

    # ---- ending ------------------------------------------------------------------------

    async def deliver_notifications(self) -> None:
        """Wait until every notification made so far was delivered (or cancelled): the held
        ones start when their observer answered, which it is about to do."""
        while self._held:
            await self._released.wait()
        await self._notifications.wait_idle()

    def cancel_tools(self, reason: str) -> None:
        self._tools.cancel(reason)

    def cancel(self, reason: str) -> None:
        """Cancel every call; held calls are dropped (the cell ends without them)."""
        for _, tool in self._held:  # dropped unstarted: their slots go back now (rule 5)
            self._admission.release_call()
            self.pending_tools -= tool
        self._held.clear()
        self._released.set()
        self._notifications.cancel(reason)
        self._tools.cancel(reason)

    async def wait_idle(self) -> None:
        """Wait until every call returned, for at most `CLEANUP_GRACE` (DESIGN section 4)."""
        with trio.move_on_after(CLEANUP_GRACE):
            await self._notifications.wait_idle()
            await self._tools.wait_idle()

    # ---- running -----------------------------------------------------------------------

    async def _invoke_tool(self, call_id: int, call: NestedToolCall) -> None:
        try:
            await self._run_tool(call_id, call)
        finally:
            self._admission.release_call()
            self.pending_tools -= 1

    async def _run_tool(self, call_id: int, call: NestedToolCall) -> None:
        try:
            result = await self._delegate.invoke_tool(call)
            payload = _encode_json(result)
        except ToolError as error:
            self._answer(call_id, rejection=error.text)
        except Exception as error:
            if not isinstance(error, TypeError | ValueError | OverflowError):
                logger.warning("tool %s of exec cell %s raised", call.tool_name.name,
                               self._cell_id, exc_info=True)  # fmt: skip
            self._answer(call_id, rejection=tool_failure_message(call.tool_name.name, error))
        else:
            self._answer(call_id, result_json=payload)

    def _answer(
        self, call_id: int, *, result_json: bytes | None = None, rejection: str | None = None
    ) -> None:
        if self._accepting():
            self._submit(lambda: self._settle(call_id, result_json, rejection))

    def _settle(self, call_id: int, result_json: bytes | None, rejection: str | None) -> None:
        if not self._accepting():
            return  # rule 2: a late answer for a cell that ended is discarded
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
            await self._delegate.notify(self._request.tool_call_id, self._cell_id, text)
        except Exception as error:
            logger.warning("failed to deliver code mode notification: %s", error)
        finally:
            self._admission.release_call()
