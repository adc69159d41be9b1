"""What the sans-IO connections hand to their trio adapters (`next_event()`).

Events are frozen Structs; each names one thing the adapter must act on. Neither connection
hands out raw frames: ids are checked, answers are routed, retired answers are parked, before an
event leaves the connection.

    client side                          host side
    HandshakeCompleted, HandshakeRejected   HandshakeCompleted
    Answered, InitialAnswered               RequestReceived, CancelRequested, PreemptRequested
    DelegateRequested, DelegateCancelled    DelegateAnswered
    CellEnded                               ConnectionEnded
    ConnectionEnded
"""

from __future__ import annotations

import msgspec

from .._api import Pending, RuntimeResponse
from ..observability._report import CellReport
from ._connection_messages import RejectReason
from ._messages import (
    Err,
    HostRequest,
    HostResponse,
    NotificationDelivered,
    NotificationSend,
    Ok,
    ToolInvoke,
    ToolResult,
)


class _Event(msgspec.Struct, frozen=True, kw_only=True):
    pass


class HandshakeCompleted(_Event, frozen=True):
    """The handshake succeeded with these capabilities."""

    capabilities: frozenset[str]


class HandshakeRejected(_Event, frozen=True):
    """The host refused the client's hello; the connection is over."""

    reason: RejectReason


class Answered(_Event, frozen=True):
    """The answer of operation `request_id` (open, execute, wait, terminate, shutdown).

    For a wait or a terminate the answer may have been built (or completed) by the connection
    from output parked for the cell, so the adapter never sees a frame for it.
    """

    request_id: int
    result: Ok[HostResponse] | Err


class InitialAnswered(_Event, frozen=True):
    """The initial response of the cell started by execute `request_id`."""

    request_id: int
    result: Ok[RuntimeResponse | Pending] | Err


class DelegateRequested(_Event, frozen=True):
    """The host asks the client to run a tool call or deliver a notification."""

    call_id: int
    session_id: str
    cell_id: str
    request: ToolInvoke | NotificationSend


class DelegateCancelled(_Event, frozen=True):
    """The host no longer wants the answer of reverse call `call_id`: cancel it."""

    call_id: int


class CellEnded(_Event, frozen=True):
    """`cell/closed`: the cell is gone; its reverse calls are cancelled, none will follow.
    `report`: its runtime's account, when the cell was traced."""

    session_id: str
    cell_id: str
    report: CellReport | None = None


class RequestReceived(_Event, frozen=True):
    """(host) A valid operation to run; answer it with `respond` (or `execution_started`)."""

    request_id: int
    request: HostRequest


class CancelRequested(_Event, frozen=True):
    """(host) The client cancelled active operation `request_id` (an execute or a wait)."""

    request_id: int


class PreemptRequested(_Event, frozen=True):
    """(host) `operation/yield`: the observation of active operation `request_id` (an
    execute's initial response or a wait) should return `Yielded` now."""

    request_id: int


class DelegateAnswered(_Event, frozen=True):
    """(host) The client's answer to reverse call `call_id`."""

    call_id: int
    result: Ok[ToolResult | NotificationDelivered] | Err


class StoredValuesCommitted(_Event, frozen=True):
    """(client) `session/committed`: what a cell of a session that keeps its stored values
    committed."""

    session_id: str
    values: dict[str, bytes]


class ApprovalWaiting(_Event, frozen=True):
    """(host) `delegate/waiting`: tool call `call_id` started or stopped waiting for its
    approval in the application."""

    call_id: int
    waiting: bool


class ResumeRequested(_Event, frozen=True):
    """Host: a new stream's first frame asks to resume a cut connection (instead of a hello).
    The adapter finds the connection `token` names and hands it the stream, or refuses
    (`HostConnection.refuse_resume`). The token is a secret: never log this event."""

    token: str
    received: int


class GoodbyeReceived(_Event, frozen=True):
    """The peer ends the connection on purpose: the end of its stream is the end (the host
    frees the client's sessions at once; the client does not try to resume)."""


class ConnectionResumed(_Event, frozen=True):
    """Client: the host took the resume; the frames it missed are queued again."""


class ResumeFailed(_Event, frozen=True):
    """Client: the host refused the resume (`reason`, its text); the connection is lost."""

    reason: str


class ConnectionEnded(_Event, frozen=True):
    """The peer closed its side at a frame boundary."""


ClientEvent = (  # what `ClientConnection.next_event` hands out
    HandshakeCompleted
    | HandshakeRejected
    | Answered
    | InitialAnswered
    | DelegateRequested
    | DelegateCancelled
    | CellEnded
    | StoredValuesCommitted
    | ConnectionResumed
    | ResumeFailed
    | GoodbyeReceived
    | ConnectionEnded
)
HostEvent = (  # what `HostConnection.next_event` hands out
    HandshakeCompleted
    | HandshakeRejected
    | ResumeRequested
    | GoodbyeReceived
    | RequestReceived
    | CancelRequested
    | PreemptRequested
    | DelegateAnswered
    | ApprovalWaiting
    | ConnectionEnded
)


class ClientStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """What a client connection holds (design.md, style 11): each count falls back to 0 when nothing
    is in flight, whatever ran before.

    Parameters:
        requests: operations awaiting their answer (observations excluded).
        observations: initial responses and waits not yet answered, retired ones included.
        cells: cells the connection keeps a view of (live, or with parked output).
        calls: reverse calls received and not yet answered or cancelled.
        sessions: sessions open or opening.
    """

    requests: int
    observations: int
    cells: int
    calls: int
    sessions: int


class HostStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """What a host connection holds (design.md, style 11).

    Parameters:
        requests: active requests (an execute until its initial response).
        sessions: sessions open, opening or closing.
        routes: cells whose `cell/closed` is not sent yet.
        calls: reverse calls sent and not yet answered or cancelled.
    """

    requests: int
    sessions: int
    routes: int
    calls: int
