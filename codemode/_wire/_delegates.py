"""The client's live cells and the reverse calls the host makes for them.

`ClientCells` keeps, per cell, the delegate given to `execute` and a `CallbackGroup` of its calls
(tool calls and notifications, run by the link's `CallWorkers`, tasks of the link's nursery).

Rules (design.md, host 4.4):
1. A reverse call runs its delegate method in a worker task; its answer goes back through the
   connection, which drops it if the host cancelled the call meanwhile (never a late answer).
2. `delegate/cancel` cancels one call; `cell/closed` (or the loss of the host) cancels all of a
   cell's calls, and `cell_closed` runs once they returned or after the 1 s grace, exactly once.
3. The delegate sees the cell's public id (`g2:1` after a host restart).
4. A pending frontier reaches its caller after the delegate saw every call received before it
   (`all_started`), as in-process: the application can settle the calls it lists.
5. Whatever a delegate raises (`SystemExit` and other `BaseException`s too) fails only its call
   (`contained`): only the call's own cancellation passes through.
6. The calls run in the provider's `CallWorkers` (tasks of a detached nursery, so leaving the
   provider's block does not wait for a call that ignores cancellation); without them, in the
   link's own nursery.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from functools import partial

import msgspec
import trio

from .._api import SessionDelegate
from .._governance import approval_reporter
from .._text import well_formed
from .._trio import CLEANUP_GRACE, CallbackGroup, CallWorkers, DelegateCall, contained
from ..errors import (
    HOST_LOST_REASON,
    ErrorKind,
    ToolDeniedError,
    ToolError,
    tool_failure_message,
)
from ..observability import CellReport, CellTrace
from ..protocol import (
    DENIAL_CAPABILITY,
    ClientConnection,
    DelegateRequested,
    Err,
    NotificationDelivered,
    Ok,
    ToolInvoke,
    ToolResult,
)

# The process provider's logger, where the links have always logged (the remote provider's too).
logger = logging.getLogger("codemode.process")

Key = tuple[str, str]
"""(session id, wire cell id)."""

LINK_WORKERS = 64
"""Workers a host link keeps parked for reverse calls (as many as the calls of 64 sessions
with a tool call each)."""


class ClientCell:
    """A live cell as the client sees it: who to call back, and its calls in flight."""

    def __init__(
        self, session_id: str, public_id: str, delegate: SessionDelegate, workers: CallWorkers
    ) -> None:
        self.session_id = session_id
        self.public_id = public_id
        self.delegate = delegate
        self.calls = CallbackGroup(workers)
        self.is_closed = False
        """True once its `cell_closed` ran."""
        # Made only for a waiter: most cells close with nobody waiting, and a `trio.Event`
        # made and set per cell was about 1 % of the client's instructions a tool cell.
        self._closed: trio.Event | None = None

    def mark_closed(self) -> None:
        self.is_closed = True
        if self._closed is not None:
            self._closed.set()

    async def wait_closed(self) -> None:
        """Wait until its `cell_closed` ran."""
        if self.is_closed:
            return
        if self._closed is None:
            self._closed = trio.Event()
        await self._closed.wait()


class ClientCells:
    """The cells of one host link and their reverse calls.

    Args:
        connection: where answers go.
        flush: wakes the link's writer.
    """

    def __init__(
        self,
        connection: ClientConnection,
        flush: Callable[[], None],
        workers: CallWorkers | None = None,
    ) -> None:
        self._connection = connection
        self._flush = flush
        self._nursery: trio.Nursery | None = None
        self._workers = workers  # rule 6
        self._live: dict[Key, ClientCell] = {}
        self._closing: dict[Key, ClientCell] = {}
        self._calls: dict[int, DelegateCall] = {}

    def serve_in(self, nursery: trio.Nursery) -> None:
        """Where calls and closings run (the link's nursery, cancelled at the link's end)."""
        self._nursery = nursery
        if self._workers is None:
            self._workers = CallWorkers(nursery, keep=LINK_WORKERS)

    @property
    def workers(self) -> CallWorkers:
        """Where the calls run (and the link's reading: `_stream.py`); set by `serve_in`."""
        assert self._workers is not None
        return self._workers

    # ---- cells ---------------------------------------------------------------------------

    def admit(self, key: Key, public_id: str, delegate: SessionDelegate) -> None:
        assert self._workers is not None
        self._live[key] = ClientCell(key[0], public_id, delegate, self._workers)

    def close(self, key: Key, report: CellReport | None = None) -> None:
        """Cancel the cell's calls; `cell_closed` once they returned or after the grace (a
        traced cell's delegate gets the host's `report` first)."""
        cell = self._live.pop(key, None)
        if cell is None:
            return
        if report is not None and isinstance(cell.delegate, CellTrace):
            cell.delegate.cell_report(report)
        if cell.calls.idle:
            self._closed(cell)  # nothing to wait for: no task (the common case)
            return
        cell.calls.cancel("the cell closed")
        self._closing[key] = cell
        assert self._nursery is not None
        try:
            self._nursery.start_soon(self._finish, key, cell)
        except RuntimeError:  # the link's nursery already closed: no grace left to give
            del self._closing[key]
            self._closed(cell)

    def close_all(self) -> None:
        """The link is lost: every call is cancelled, every live cell closed (once)."""
        for call in self._calls.values():
            call.cancel(HOST_LOST_REASON)
        self._calls.clear()
        for key in list(self._live):
            self.close(key)

    async def _finish(self, key: Key, cell: ClientCell) -> None:
        with trio.move_on_after(CLEANUP_GRACE):
            await cell.calls.wait_idle()
        del self._closing[key]
        self._closed(cell)

    def _closed(self, cell: ClientCell) -> None:
        try:
            cell.delegate.cell_closed(cell.public_id)
        except BaseException:  # also SystemExit: the application's code ends nothing (rule 5)
            logger.exception("cell_closed(%r) raised", cell.public_id)
        finally:
            cell.mark_closed()

    def of_session(self, session_id: str) -> list[ClientCell]:
        """The session's cells that are live or closing (their `cell_closed` still to come)."""
        cells = [*self._live.values(), *self._closing.values()]
        return [cell for cell in cells if cell.session_id == session_id]

    async def wait_closing(self) -> None:
        """Wait until every closing cell's `cell_closed` ran."""
        while self._closing:
            await next(iter(self._closing.values())).wait_closed()

    async def settle(self, key: Key, *, closed: bool, bound: float) -> None:
        """Wait until the cell's calls returned (or, with `closed`, until its `cell_closed`
        ran), for at most `bound` seconds; shielded (its caller already holds an answer)."""
        cell = self._live.get(key) or self._closing.get(key)
        if cell is None or (cell.is_closed if closed else cell.calls.idle):
            return  # nothing to wait for: no scopes, no pass of the scheduler
        with trio.CancelScope(shield=True), trio.move_on_after(bound):
            if closed:
                await cell.wait_closed()
            else:
                await cell.calls.wait_idle()

    async def all_started(self, key: Key, *, bound: float) -> None:
        """Wait until every call received for the cell reached its delegate (rule 4), for at
        most `bound` seconds; shielded (its caller already holds an answer)."""
        cell = self._live.get(key)
        if cell is None or cell.calls.all_running:
            return
        with trio.CancelScope(shield=True), trio.move_on_after(bound):
            await cell.calls.all_started()

    # ---- reverse calls -------------------------------------------------------------------

    def start_call(self, event: DelegateRequested, queue: deque[DelegateCall] | None) -> bool:
        """Run a reverse call in a worker, or put it in `queue`, the reading's, which runs it
        next (`_stream.py`); False if the cell has no delegate here (a bug on this side)."""
        cell = self._live.get((event.session_id, event.cell_id))
        if cell is None:
            return False
        if queue is None:
            call = cell.calls.start(self._run_call, event, cell)
        else:
            call = cell.calls.prepare(self._run_call, event, cell)
            queue.append(call)
        self._calls[event.call_id] = call
        return True

    def _approval(self, call_id: int, waiting: bool) -> None:
        """Rule 6 of `_governance`: the host learns the call waits for approval."""
        if self._connection.send_approval_waiting(call_id, waiting):
            self._flush()

    def _denials(self) -> bool:
        """Whether the host takes the `denied` kind (`DENIAL_CAPABILITY`)."""
        return DENIAL_CAPABILITY in self._connection.capabilities

    def cancel_call(self, call_id: int) -> None:
        call = self._calls.pop(call_id, None)
        if call is not None:
            call.cancel()

    async def _run_call(self, event: DelegateRequested, cell: ClientCell) -> None:
        request = event.request
        result: Ok[ToolResult | NotificationDelivered] | Err
        try:
            if isinstance(request, ToolInvoke):
                call = request.invocation
                if call.cell_id != cell.public_id:  # a later generation's (`Binding.public_id`)
                    call = msgspec.structs.replace(call, cell_id=cell.public_id)
                reporter = approval_reporter.set(partial(self._approval, event.call_id))
                try:
                    result = Ok(value=ToolResult(result=await cell.delegate.invoke_tool(call)))
                finally:
                    approval_reporter.reset(reporter)
            else:
                await cell.delegate.notify(request.call_id, cell.public_id, request.text)
                result = Ok(value=NotificationDelivered())
        except ToolError as refusal:
            # Repaired as the in-process engine reads it, so both providers reject alike. A
            # denial is one only for a host that knows the kind (the capability rule).
            denied = isinstance(refusal, ToolDeniedError) and self._denials()
            kind = ErrorKind.DENIED if denied else ErrorKind.TOOL
            result = Err(kind=kind, message=well_formed(refusal.text))
        except BaseException as error:
            if not contained(error):
                raise  # the call's own cancellation (rule 5)
            logger.warning("code-mode delegate task failed", exc_info=True)
            result = Err(kind=ErrorKind.TOOL, message=_failure_text(event, error))
        finally:
            self._calls.pop(event.call_id, None)
        try:
            self._connection.send_delegate_response(event.call_id, result)
        except (TypeError, ValueError, OverflowError, msgspec.EncodeError) as unencodable:
            failure = Err(kind=ErrorKind.TOOL, message=_failure_text(event, unencodable))
            self._connection.send_delegate_response(event.call_id, failure)
        self._flush()


def _failure_text(event: DelegateRequested, error: BaseException) -> str:
    if isinstance(event.request, ToolInvoke):
        return tool_failure_message(event.request.invocation.tool_name.name, error)
    return f"code-mode delegate task failed: {error}"
