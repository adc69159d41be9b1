"""Every frame of the host protocol as a typed, tagged, frozen `msgspec.Struct`.

The message set follows design.md, host 2, carried in msgpack: top-level messages are
tagged by `type`, requests by `method`, results by `status`. Every struct rejects unknown fields
at every level (the payload types of `codemode._api` do too). Field names are snake_case
throughout: this is codemode's own wire, not a byte-compatible copy of the reference's JSON.

The connection's own frames (hello, ready, refusals, ping, pong) are in `_connection_messages`;
this module holds the requests, answers and reverse calls, and the unions of each direction.

    client -> host   Hello, OperationRequest, OperationCancel, OperationYield, DelegateResponse
    host -> client   Ready, Rejected, OperationResponse, InitialResponse, DelegateRequest,
                     DelegateCancel, CellClosed
    both ways        Ping, Pong (with the heartbeat capability)
    resume           Ack, Goodbye both ways; Resume (client); Resumed (host)

Rules (design.md, host 2.2; pinned by `invalid_protocol_states_cannot_be_constructed_or_decoded`):
1. Invalid states cannot be built nor decoded: an empty session id, a version below 1, an empty
   or repeated version list, a blank or repeated capability, a capability listed as required and
   optional, a request id below 1. Each check runs in `__post_init__`, which msgspec also runs
   when decoding (its `ValueError` becomes a decode error).
2. Every error result carries an `ErrorKind` beside the reference's text, so the client picks the
   exception class from the kind, never from the text.
"""

from __future__ import annotations

from typing import Any, Generic, TypeAlias, TypeVar

import msgspec

from .._api import (
    CellInfo,
    CellLimits,
    ExecuteRequest,
    NestedToolCall,
    Pending,
    RuntimeResponse,
    SessionUsage,
    WaitOutcome,
    WaitRequest,
)
from ..errors import ErrorKind
from ..observability._report import CellReport, TraceContext
from ._connection_messages import (
    Ack,
    Goodbye,
    Hello,
    Ping,
    Pong,
    Ready,
    Rejected,
    Resume,
    Resumed,
)
from ._message_base import Message as _Message
from ._message_base import RequestId
from ._message_checks import check_id_and_session_fields as _check_id_and_session_fields
from ._message_checks import check_id_field as _check_id_field
from ._message_checks import check_session_field as _check_session_field

T = TypeVar("T")


# ---- results -----------------------------------------------------------------------------


class Ok(
    msgspec.Struct,
    Generic[T],
    frozen=True,
    kw_only=True,
    forbid_unknown_fields=True,
    tag="ok",
    tag_field="status",
):
    value: T


class Err(
    msgspec.Struct,
    frozen=True,
    kw_only=True,
    forbid_unknown_fields=True,
    tag="error",
    tag_field="status",
):
    """A failed operation or reverse call.

    Parameters:
        kind: what the failure means (the client maps it to an exception class).
        message: the reference's text.
    """

    kind: ErrorKind
    message: str


class _Numbered(_Message, frozen=True):
    """A message about request (or reverse call) `id`."""

    id: RequestId

    # A compiled function as `__post_init__` (`_message_checks`): msgspec calls it with the
    # message, and mypy, which expects a method here, is told so once per base.
    __post_init__ = _check_id_field  # type: ignore[misc]


class _OfSession(_Message, frozen=True):
    """A message about session `session_id`."""

    session_id: str

    __post_init__ = _check_session_field  # type: ignore[misc]  # see `_Numbered`


# ---- operations --------------------------------------------------------------------------


class _Request(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, tag_field="method"
):
    session_id: str

    __post_init__ = _check_session_field  # type: ignore[misc]  # see `_Numbered`


class OpenSession(_Request, tag="session/open", frozen=True, omit_defaults=True):
    """Open a session; `store_load=False`: its cells have no `store` / `load` (the fields are
    sent only when they differ from their defaults)."""

    cell_execution_limits: CellLimits | None = None
    store_load: bool = True
    stored_values: dict[str, bytes] | None = None
    """The stored values the session starts with (`KEPT_VALUES_CAPABILITY`): a kept copy."""
    keep_stored_values: bool = False
    """Send each commit of the session's cells back (`session/committed`)."""


class Execute(_Request, tag="session/execute", frozen=True, omit_defaults=True):
    """Start a cell; `trace`: the client's cell span, sent only under `TRACE_CAPABILITY`."""

    request: ExecuteRequest
    trace: TraceContext | None = None


class ExecuteToPending(Execute, tag="session/executeToPending", frozen=True):
    """An execute whose initial observation runs to the cell's pending frontier (a `Pending`,
    `Completed` or `Terminated` initial response, never `Yielded`)."""


class Wait(_Request, tag="session/wait", frozen=True, omit_defaults=True):
    """Observe a cell; `trace`: the client's observation span (`TRACE_CAPABILITY`)."""

    request: WaitRequest
    trace: TraceContext | None = None


class WaitToPending(_Request, tag="session/waitToPending", frozen=True, omit_defaults=True):
    """Resume the cell and observe it to its next pending frontier (or its end)."""

    cell_id: str
    trace: TraceContext | None = None


class Terminate(_Request, tag="session/terminate", frozen=True):
    cell_id: str


class ShutdownSession(_Request, tag="session/shutdown", frozen=True):
    pass


class ListCells(_Request, tag="session/cells", frozen=True):
    """The session's live cells (needs `INVENTORY_CAPABILITY`), answered with a `CellList`."""


class GetUsage(_Request, tag="session/usage", frozen=True):
    """What the session used of its budgets (needs `BUDGET_CAPABILITY`), answered with a
    `UsageReport`."""


HostRequest: TypeAlias = (
    OpenSession
    | Execute
    | ExecuteToPending
    | Wait
    | WaitToPending
    | Terminate
    | ShutdownSession
    | ListCells
    | GetUsage
)


class SessionReady(_OfSession, tag="session/ready", frozen=True):
    pass


class ExecutionStarted(_Message, tag="execution/started", frozen=True):
    cell_id: str


class WaitCompleted(_Message, tag="wait/completed", frozen=True):
    outcome: WaitOutcome


class SessionClosed(_OfSession, tag="session/closed", frozen=True):
    pass


class CellList(_Message, tag="session/cellList", frozen=True):
    """The answer to `session/cells`, with the host's cell ids."""

    cells: list[CellInfo]


class UsageReport(_Message, tag="session/usageReport", frozen=True):
    """The answer to `session/usage`."""

    usage: SessionUsage


HostResponse: TypeAlias = (
    SessionReady | ExecutionStarted | WaitCompleted | SessionClosed | CellList | UsageReport
)


class OperationRequest(_Numbered, tag="operation/request", frozen=True):
    request: HostRequest


class OperationCancel(_Numbered, tag="operation/cancel", frozen=True):
    """Cancel an in-flight execute or wait (a started cell keeps running)."""


class OperationYield(_Numbered, tag="operation/yield", frozen=True):
    """Make an in-flight execute's initial observation, or a wait, return `Yielded` now (the
    cell keeps running); no effect on frontier observations. Needs `YIELD_CAPABILITY`."""


class OperationResponse(_Numbered, tag="operation/response", frozen=True):
    result: Ok[HostResponse] | Err


class InitialResponse(_Numbered, tag="execute/initialResponse", frozen=True, omit_defaults=True):
    """The first observation of the cell started by execute request `id`.

    `closed` (only with `CLOSING_INITIAL_CAPABILITY`): the cell closed before this response
    went out, and this frame stands for its `cell/closed` too (none follows); `report` is then
    what `cell/closed` would have carried (`TRACE_CAPABILITY`)."""

    result: Ok[RuntimeResponse | Pending] | Err
    closed: bool = False
    report: CellReport | None = None


# ---- reverse calls -----------------------------------------------------------------------


class ToolInvoke(_Message, tag="tool/invoke", frozen=True):
    invocation: NestedToolCall


class NotificationSend(_Message, tag="notification/send", frozen=True):
    call_id: str
    cell_id: str
    text: str


class ToolResult(_Message, tag="tool/result", frozen=True):
    result: Any


class NotificationDelivered(_Message, tag="notification/delivered", frozen=True):
    pass


class DelegateRequest(_Numbered, tag="delegate/request", frozen=True):
    session_id: str
    request: ToolInvoke | NotificationSend

    __post_init__ = _check_id_and_session_fields  # type: ignore[misc]  # see `_Numbered`


class DelegateResponse(_Numbered, tag="delegate/response", frozen=True):
    result: Ok[ToolResult | NotificationDelivered] | Err


class DelegateWaiting(_Numbered, tag="delegate/waiting", frozen=True):
    """Tool call `id` started (`waiting`) or stopped waiting for its approval in the
    application (needs `APPROVAL_CAPABILITY`): the host lists it in `session/cells` and pauses
    the cell's wall-clock limit while every call of the cell waits so."""

    waiting: bool


class DelegateCancel(_Numbered, tag="delegate/cancel", frozen=True):
    pass


class SessionCommitted(_OfSession, tag="session/committed", frozen=True):
    """What a cell of a session opened with `keep_stored_values` committed (its writes, as
    JSON texts, merged key by key into the client's copy); sent before the cell's completion."""

    values: dict[str, bytes]


class CellClosed(_OfSession, tag="cell/closed", frozen=True, omit_defaults=True):
    """The cell is gone; `report`: its runtime's account, for a traced cell
    (`TRACE_CAPABILITY`)."""

    cell_id: str
    report: CellReport | None = None


ClientMessage: TypeAlias = (
    Hello
    | Resume
    | Goodbye
    | Ack
    | OperationRequest
    | OperationCancel
    | OperationYield
    | DelegateResponse
    | DelegateWaiting
    | Ping
    | Pong
)
HostMessage: TypeAlias = (
    Ready
    | Resumed
    | Goodbye
    | Ack
    | Rejected
    | OperationResponse
    | InitialResponse
    | DelegateRequest
    | DelegateCancel
    | CellClosed
    | SessionCommitted
    | Ping
    | Pong
)
