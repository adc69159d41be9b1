"""Every frame of the host protocol as a typed, tagged, frozen `msgspec.Struct`.

The message set follows reference-host section 2, carried in msgpack: top-level messages are
tagged by `type`, requests by `method`, results by `status`. Every struct rejects unknown fields
at every level (the payload types of `codemode._api` do too). Field names are snake_case
throughout: this is codemode's own wire, not a byte-compatible copy of the reference's JSON.

    client -> host   Hello, OperationRequest, OperationCancel, DelegateResponse
    host -> client   Ready, Rejected, OperationResponse, InitialResponse, DelegateRequest,
                     DelegateCancel, CellClosed
"""

from __future__ import annotations

from typing import Any, Generic, TypeAlias, TypeVar

import msgspec

from .._api import (
    CellLimits,
    ExecuteRequest,
    NestedToolCall,
    RuntimeResponse,
    WaitOutcome,
    WaitRequest,
)

PROTOCOL_VERSION = 1
LIMITS_CAPABILITY = "session-cell-execution-resource-limits"
"""Carries `CellLimits` on `session/open` (DESIGN section 4)."""

T = TypeVar("T")


class _Message(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, tag_field="type"
):
    pass


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
    message: str


# ---- handshake ---------------------------------------------------------------------------


class Hello(_Message, tag="connection/hello", frozen=True):
    """First client frame: versions and capabilities the client speaks."""

    supported_versions: list[int]
    required_capabilities: list[str] = msgspec.field(default_factory=list)
    optional_capabilities: list[str] = msgspec.field(default_factory=list)


class Ready(_Message, tag="connection/ready", frozen=True):
    selected_version: int
    capabilities: list[str]


class NoCompatibleVersion(_Message, tag="noCompatibleVersion", frozen=True):
    supported_versions: list[int]


class MissingRequiredCapability(_Message, tag="missingRequiredCapability", frozen=True):
    capability: str


class InvalidHello(_Message, tag="invalidHello", frozen=True):
    message: str


RejectReason: TypeAlias = NoCompatibleVersion | MissingRequiredCapability | InvalidHello


class Rejected(_Message, tag="connection/rejected", frozen=True):
    reason: RejectReason


# ---- operations --------------------------------------------------------------------------


class _Request(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, tag_field="method"
):
    pass


class OpenSession(_Request, tag="session/open", frozen=True):
    session_id: str
    cell_execution_limits: CellLimits | None = None


class Execute(_Request, tag="session/execute", frozen=True):
    session_id: str
    request: ExecuteRequest


class Wait(_Request, tag="session/wait", frozen=True):
    session_id: str
    request: WaitRequest


class Terminate(_Request, tag="session/terminate", frozen=True):
    session_id: str
    cell_id: str


class ShutdownSession(_Request, tag="session/shutdown", frozen=True):
    session_id: str


HostRequest: TypeAlias = OpenSession | Execute | Wait | Terminate | ShutdownSession


class SessionReady(_Message, tag="session/ready", frozen=True):
    session_id: str


class ExecutionStarted(_Message, tag="execution/started", frozen=True):
    cell_id: str


class WaitCompleted(_Message, tag="wait/completed", frozen=True):
    outcome: WaitOutcome


class SessionClosed(_Message, tag="session/closed", frozen=True):
    session_id: str


HostResponse: TypeAlias = SessionReady | ExecutionStarted | WaitCompleted | SessionClosed


class OperationRequest(_Message, tag="operation/request", frozen=True):
    id: int
    request: HostRequest


class OperationCancel(_Message, tag="operation/cancel", frozen=True):
    """Cancel an in-flight execute or wait (a started cell keeps running)."""

    id: int


class OperationResponse(_Message, tag="operation/response", frozen=True):
    id: int
    result: Ok[HostResponse] | Err


class InitialResponse(_Message, tag="execute/initialResponse", frozen=True):
    """The first observation of the cell started by execute request `id`."""

    id: int
    result: Ok[RuntimeResponse] | Err


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


class DelegateRequest(_Message, tag="delegate/request", frozen=True):
    id: int
    session_id: str
    request: ToolInvoke | NotificationSend


class DelegateResponse(_Message, tag="delegate/response", frozen=True):
    id: int
    result: Ok[ToolResult | NotificationDelivered] | Err


class DelegateCancel(_Message, tag="delegate/cancel", frozen=True):
    id: int


class CellClosed(_Message, tag="cell/closed", frozen=True):
    session_id: str
    cell_id: str


ClientMessage: TypeAlias = Hello | OperationRequest | OperationCancel | DelegateResponse
HostMessage: TypeAlias = (
    Ready
    | Rejected
    | OperationResponse
    | InitialResponse
    | DelegateRequest
    | DelegateCancel
    | CellClosed
)
