"""The client's book of reverse calls: the tool calls and notifications the host asked for.

Rules (rule 4 of `ClientConnection`):
1. A call is answered at most once, and never after its `delegate/cancel` or its cell's
   `cell/closed` (the host cancelled it with the cell).
2. A delegate id is used once: a repeat of one of the last 4096 is a `RemoteProtocolError`.
3. An answer too large for a frame becomes a `frame_limit` error for that call only.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

from ..errors import ErrorKind
from ._cells import CellBook
from ._cellview import CellView
from ._codec import FrameTooLargeError
from ._errors import RemoteProtocolError
from ._events import DelegateCancelled, DelegateRequested
from ._messages import (
    DelegateRequest,
    DelegateResponse,
    DelegateWaiting,
    Err,
    NotificationDelivered,
    Ok,
    ToolInvoke,
    ToolResult,
)
from ._recent import RecentNumbers

DelegateResult = Ok[ToolResult | NotificationDelivered] | Err


class ReverseCalls:
    """The reverse calls of one client connection still owed an answer.

    Args:
        events: the connection's event queue.
        queue: queues a frame on the connection.
        cells: the connection's cells (a cell's view knows its calls).
    """

    def __init__(
        self,
        events: collections.deque[object],
        queue: Callable[[object], None],
        cells: CellBook,
    ) -> None:
        self._events = events
        self._queue = queue
        self._cells = cells
        self._calls: dict[int, CellView] = {}
        self._recent = RecentNumbers()

    def __len__(self) -> int:
        return len(self._calls)

    def clear(self) -> None:
        self._calls.clear()

    def requested(self, message: DelegateRequest, view: CellView) -> None:
        """The host asks for a call of the live cell `view` (rule 2)."""
        call_id = message.id
        if call_id in self._recent:
            raise RemoteProtocolError(f"duplicate code-mode delegate request ID {call_id}")
        self._recent.add(call_id)
        self._calls[call_id] = view
        view.calls.add(call_id)
        request = message.request
        cell_id = request.invocation.cell_id if isinstance(request, ToolInvoke) else request.cell_id
        self._events.append(
            DelegateRequested(
                call_id=call_id, session_id=message.session_id, cell_id=cell_id, request=request
            )
        )

    def cancelled(self, call_id: int) -> None:
        """`delegate/cancel`; ignored when answered already (the two frames crossed)."""
        view = self._calls.pop(call_id, None)
        if view is not None:
            view.calls.discard(call_id)
            self._events.append(DelegateCancelled(call_id=call_id))
            self._cells.forget_if_done(view)

    def cell_closed(self, view: CellView) -> None:
        """The cell closed: its calls were cancelled with it, no answer may follow."""
        for call_id in view.calls:
            self._calls.pop(call_id, None)
        view.calls.clear()

    def waiting(self, call_id: int, waiting: bool) -> bool:
        """Queue `delegate/waiting` for an open call; False if the host no longer wants it."""
        if call_id not in self._calls:
            return False
        self._queue(DelegateWaiting(id=call_id, waiting=waiting))
        return True

    def respond(self, call_id: int, result: DelegateResult) -> bool:
        """Queue the answer of `call_id`; False if the host no longer wants it (rule 1)."""
        view = self._calls.get(call_id)
        if view is None:
            return False
        try:
            self._queue(DelegateResponse(id=call_id, result=result))
        except FrameTooLargeError as error:
            text = f"code-mode delegate response exceeds the IPC frame limit: {error}"
            self._queue(
                DelegateResponse(id=call_id, result=Err(kind=ErrorKind.FRAME_LIMIT, message=text))
            )
        del self._calls[call_id]
        view.calls.discard(call_id)
        self._cells.forget_if_done(view)
        return True
