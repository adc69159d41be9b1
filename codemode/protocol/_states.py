"""The state tables of a connection and of the sessions it carries, on both ends.

A connection is HANDSHAKING until `connection/ready` (or a refusal), then OPEN until it ends:
CLOSED when the peer ended it or the adapter reports it lost, ERROR when either side broke the
protocol (`next_event` raised, or `send_failed()`). ERROR is final, as in h11: every later
operation raises `LocalProtocolError`, so an adapter cannot decode past a broken frame or queue
bytes nobody will read. The notifications an adapter sends from its clean-up paths (a caller
went away, the connection is lost) are accepted in every state and do nothing once it is not
open: raising there would replace a cancellation with a protocol error.

A session id is OPENING from `session/open` to its answer, OPEN until `session/shutdown`,
CLOSING until that answer, then CLOSED (forgotten, but for the recent ids the host remembers).
"""

from __future__ import annotations

import enum

from ._errors import LocalProtocolError
from ._statetable import StateTable


class ConnectionState(enum.Enum):
    HANDSHAKING = "handshaking"
    OPEN = "open"
    CLOSED = "closed"
    ERROR = "error"


class ConnectionTrigger(enum.Enum):
    READY = "handshake completed"
    REFUSED = "handshake refused"
    ENDED = "ended"
    PROTOCOL_ERROR = "protocol error"
    SEND_FAILED = "send failed"


CONNECTION: StateTable[ConnectionState, ConnectionTrigger] = StateTable(
    "wire connection",
    {
        ConnectionState.HANDSHAKING: {
            ConnectionTrigger.READY: ConnectionState.OPEN,
            ConnectionTrigger.REFUSED: ConnectionState.CLOSED,
            ConnectionTrigger.ENDED: ConnectionState.CLOSED,
            ConnectionTrigger.PROTOCOL_ERROR: ConnectionState.ERROR,
            ConnectionTrigger.SEND_FAILED: ConnectionState.ERROR,
        },
        ConnectionState.OPEN: {
            ConnectionTrigger.ENDED: ConnectionState.CLOSED,
            ConnectionTrigger.PROTOCOL_ERROR: ConnectionState.ERROR,
            ConnectionTrigger.SEND_FAILED: ConnectionState.ERROR,
        },
        ConnectionState.CLOSED: {
            ConnectionTrigger.ENDED: ConnectionState.CLOSED,
            ConnectionTrigger.SEND_FAILED: ConnectionState.CLOSED,
        },
        ConnectionState.ERROR: {
            ConnectionTrigger.ENDED: ConnectionState.ERROR,
            ConnectionTrigger.PROTOCOL_ERROR: ConnectionState.ERROR,
            ConnectionTrigger.SEND_FAILED: ConnectionState.ERROR,
        },
    },
    error=LocalProtocolError,
)


class SessionState(enum.Enum):
    OPENING = "opening"
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


class SessionTrigger(enum.Enum):
    READY = "session ready"
    REFUSED = "open refused"
    SHUTDOWN = "shutdown"
    CLOSED = "session closed"


SESSION: StateTable[SessionState, SessionTrigger] = StateTable(
    "wire session",
    {
        SessionState.OPENING: {
            SessionTrigger.READY: SessionState.OPEN,
            SessionTrigger.REFUSED: SessionState.CLOSED,
        },
        SessionState.OPEN: {
            SessionTrigger.SHUTDOWN: SessionState.CLOSING,
        },
        SessionState.CLOSING: {SessionTrigger.CLOSED: SessionState.CLOSED},
    },
    error=LocalProtocolError,
)


class SessionBook:
    """The session ids a connection knows and where each stands (`SESSION`): forgotten once
    closed or refused."""

    __slots__ = ("_states",)

    def __init__(self) -> None:
        self._states: dict[str, SessionState] = {}

    def __len__(self) -> int:
        return len(self._states)

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._states

    def get(self, session_id: str) -> SessionState | None:
        return self._states.get(session_id)

    def opening(self, session_id: str) -> None:
        self._states[session_id] = SessionState.OPENING

    def move(self, session_id: str, trigger: SessionTrigger) -> None:
        """Apply `trigger`; a session that reaches CLOSED is forgotten."""
        state = SESSION.move(self._states[session_id], trigger)
        if state is SessionState.CLOSED:
            del self._states[session_id]
        else:
            self._states[session_id] = state

    def forget(self, session_id: str) -> None:
        """Drop an id that never reached the peer (its open could not be queued)."""
        self._states.pop(session_id, None)

    def clear(self) -> None:
        self._states.clear()
