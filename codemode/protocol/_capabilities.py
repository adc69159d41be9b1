"""The capabilities a hello negotiates: each names a part of the wire added after protocol
version 1's first frames (docs/protocol.md, "Extending the wire: the capability rule").

A peer sends a field or a frame of a capability only once the other side offered it; the
message definitions (`_messages`) say which fields belong to which capability, and
`missing_capability` is the host's check of a request against what its hello negotiated.
"""

from __future__ import annotations

from typing import Final

from ._messages import (
    ExecuteToPending,
    GetUsage,
    HostRequest,
    ListCells,
    OpenSession,
    WaitToPending,
)

PROTOCOL_VERSION = 1
"""The one version of the wire; everything added since is a capability."""
LIMITS_CAPABILITY = "session-cell-execution-resource-limits"
"""Carries `CellLimits` on `session/open` (design.md, design 4)."""
PENDING_FRONTIER_CAPABILITY = "pending-frontier"
"""Enables `session/executeToPending` and `session/waitToPending` (design.md, runtime 5.9)."""
YIELD_CAPABILITY = "yield-observation"
"""Enables `operation/yield`: an active observation returns `Yielded` now (preempt)."""
INVENTORY_CAPABILITY = "cell-inventory"
"""Enables `session/cells`: the session's live cells (`Session.cells()`)."""
HEARTBEAT_CAPABILITY = "heartbeat"
"""Enables `connection/ping` and `connection/pong`, both ways: a peer that stops answering is
noticed even when its socket stays open (docs/protocol.md, "Heartbeats")."""
TRACE_CAPABILITY = "trace-context"
"""Enables the `trace` field of execute and wait requests (a W3C trace context) and the
`report` field of `cell/closed` (the runtime's `CellReport`): docs/observability.md."""
DENIAL_CAPABILITY = "tool-denial"
"""Allows the `denied` error kind on a tool call's `delegate/response`: the call's policy denied
it, and the cell's promise rejects with an `Error` (docs/governance.md)."""
WALL_TIME_CAPABILITY = "wall-time-limit"
"""Enables `CellLimits.max_wall_time_ms` in `session/open`'s limits (docs/governance.md)."""
BUDGET_CAPABILITY = "session-budget"
"""Enables `CellLimits.max_session_tool_calls` and `max_session_cpu_time_ms` in
`session/open`'s limits, and `session/usage`: what the session used (`Session.usage()`)."""
APPROVAL_CAPABILITY = "approval-wait"
"""Enables `delegate/waiting` (client -> host: a tool call started or stopped waiting for its
approval) and `CellInfo.waiting_for_approval` in `session/cellList` (docs/governance.md)."""
KEPT_VALUES_CAPABILITY = "kept-stored-values"
"""Enables `session/open`'s `stored_values` and `keep_stored_values`, and `session/committed`
(host -> client: what a cell of such a session committed), docs/durability.md."""
RESUME_CAPABILITY = "connection-resume"
"""Enables resuming a cut connection: `Ready`'s `resume_token` and `resume_grace_ms`,
`connection/ack` both ways, `connection/resume` / `connection/resumed` on a new stream, and
`connection/goodbye` (docs/protocol.md, "Resuming a cut connection"). A host offers it on a
socket only (`codemode-host --listen`), a client only over a transport it can reconnect."""
CLOSING_INITIAL_CAPABILITY = "closing-initial-response"
"""Enables `closed` and `report` on `execute/initialResponse`: a cell that closed before its
initial response went out is closed by that frame, without a `cell/closed` of its own (one
frame fewer for most cells: docs/protocol.md, "Ordering")."""
CAPABILITIES = (
    LIMITS_CAPABILITY,
    PENDING_FRONTIER_CAPABILITY,
    YIELD_CAPABILITY,
    INVENTORY_CAPABILITY,
    HEARTBEAT_CAPABILITY,
    TRACE_CAPABILITY,
    DENIAL_CAPABILITY,
    APPROVAL_CAPABILITY,
    WALL_TIME_CAPABILITY,
    BUDGET_CAPABILITY,
    KEPT_VALUES_CAPABILITY,
    RESUME_CAPABILITY,
    CLOSING_INITIAL_CAPABILITY,
)
"""Everything this version of codemode speaks, host and client alike."""


# Compared with a request's exact class (the decoder makes no other; C statics compiled): a
# failed `isinstance` against a msgspec class costs about 600 instructions compiled, and every
# execute failed five.
_OPEN_SESSION: Final = OpenSession
_LIST_CELLS: Final = ListCells
_GET_USAGE: Final = GetUsage
_EXECUTE_TO_PENDING: Final = ExecuteToPending
_WAIT_TO_PENDING: Final = WaitToPending


def missing_capability(request: HostRequest, offered: frozenset[str]) -> str | None:
    """Why the host refuses `request`: it uses a capability the hello did not negotiate (the
    capability rule; answered `invalid_request`), or None."""
    if type(request) is _OPEN_SESSION:
        keeps = request.keep_stored_values or request.stored_values is not None
        if keeps and KEPT_VALUES_CAPABILITY not in offered:
            return f"code-mode kept stored values need the `{KEPT_VALUES_CAPABILITY}` capability"
        limits = request.cell_execution_limits
        if limits is None:
            return None
        for needed, present in (
            (LIMITS_CAPABILITY, True),
            (WALL_TIME_CAPABILITY, limits.max_wall_time_ms is not None),
            (BUDGET_CAPABILITY, limits.has_session_budget),
        ):
            if present and needed not in offered:
                return f"invalid code-mode session execution limits: {needed} was not negotiated"
        return None
    kind = type(request)
    if kind is _LIST_CELLS and INVENTORY_CAPABILITY not in offered:
        return f"code-mode cell inventory needs the `{INVENTORY_CAPABILITY}` capability"
    if kind is _GET_USAGE and BUDGET_CAPABILITY not in offered:
        return f"code-mode session usage needs the `{BUDGET_CAPABILITY}` capability"
    pending = kind is _EXECUTE_TO_PENDING or kind is _WAIT_TO_PENDING
    if pending and PENDING_FRONTIER_CAPABILITY not in offered:
        return (
            f"code-mode pending frontier requests need the `{PENDING_FRONTIER_CAPABILITY}`"
            " capability"
        )
    return None
