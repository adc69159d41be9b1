"""What the host answers itself, so that the runtime never sees the request (rule 3 of
`_host.py`): a session opened twice or under a reused id, a capability the hello did not
negotiate (`missing_capability`), a request of an unknown or closing session."""

from __future__ import annotations

from ..errors import ErrorKind
from ._capabilities import missing_capability
from ._messages import Err, HostRequest
from ._recent import RecentIds
from ._states import SessionState


def invalid(message: str) -> Err:
    return Err(kind=ErrorKind.INVALID_REQUEST, message=message)


def refusal(
    request: HostRequest,
    opening: bool,
    state: SessionState | None,
    closed_sessions: RecentIds,
    offered: frozenset[str],
) -> Err | None:
    """The answer to `request`, or None for the runtime to run it. `opening`: it opens a
    session; `state`: its session's state (None: unknown); `closed_sessions`: ids that may not
    be reused; `offered`: the capabilities the hello negotiated."""
    session_id = request.session_id
    if opening:
        if state is not None:
            return invalid(f"code-mode session ID `{session_id}` is already open")
        if session_id in closed_sessions:
            return invalid(f"code-mode session ID `{session_id}` was reused")
    missing = missing_capability(request, offered)
    if missing is not None:
        return invalid(missing)
    if opening or state is SessionState.OPEN:
        return None
    if state is SessionState.CLOSING:
        return Err(kind=ErrorKind.SHUTTING_DOWN, message="code mode session is shutting down")
    return invalid(f"unknown code-mode session {session_id}")
