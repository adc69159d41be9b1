"""The listener's bounds on its connections: how many may be waiting for their hello, and how
many clients may be connected (`_listen.py`, rule 5; docs/scaling.md, "Connections").

A connection is *waiting* from its accept until its handshake completes, and has its own bound
there (`--max-waiting-connections`): past it, a new connection evicts the oldest waiting one,
so a flood of silent connections cannot keep a real client out, nor hold the host's
descriptors. Each waiting connection also has a deadline for its hello (`--hello-timeout`,
enforced by `serve_connection`). A connection whose handshake completed counts against
`--max-connections` until it ends; one past that cap is closed at once. Every eviction and
refusal is logged with its reason; no other client notices.
"""

from __future__ import annotations

import collections
import logging

import trio

logger = logging.getLogger("codemode.host")

HELLO_TIMEOUT = 10.0
"""Seconds a connection has to complete its hello (`--hello-timeout`)."""
MAX_WAITING_CONNECTIONS = 64
"""Connections at once that have not completed their hello (`--max-waiting-connections`)."""
MAX_CONNECTIONS = 1024
"""Clients connected at once past their hello (`--max-connections`)."""
RESUME_GRACE = 30.0
"""Seconds a cut connection keeps its sessions, cells and pending calls for its client to
resume it (`--resume-grace`; 0: no resume, a cut frees them at once)."""


class ConnectionBook:
    """Which connections wait for their hello (oldest first) and how many clients are in."""

    def __init__(self, *, max_waiting: int, max_connections: int) -> None:
        self.max_waiting = max_waiting
        self.max_connections = max_connections
        self._waiting: collections.OrderedDict[int, tuple[str, trio.CancelScope]] = (
            collections.OrderedDict()
        )
        self._connected: set[int] = set()
        self._next = 0

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def connected(self) -> int:
        return len(self._connected)

    def arrived(self, peer: str, scope: trio.CancelScope) -> int:
        """A connection was accepted; `scope` ends it. Evicts the oldest waiting connections
        past the bound. Returns the connection's key."""
        while len(self._waiting) >= self.max_waiting:
            _, (old_peer, old_scope) = self._waiting.popitem(last=False)
            logger.warning(
                "client %s closed: %d connections were waiting for their hello"
                " (--max-waiting-connections); the oldest goes",
                old_peer,
                self.max_waiting,
            )
            old_scope.cancel()
        key = self._next
        self._next += 1
        self._waiting[key] = (peer, scope)
        return key

    def ready(self, key: int) -> bool:
        """The connection completed its hello: False (and logged) when it is one client too
        many."""
        peer, _ = self._waiting.pop(key, ("?", None))
        if len(self._connected) >= self.max_connections:
            logger.warning(
                "client %s closed: %d clients are connected (--max-connections)",
                peer,
                self.max_connections,
            )
            return False
        self._connected.add(key)
        return True

    def handed_over(self, key: int) -> None:
        """The connection resumed another one and serves on its behalf: it is neither
        waiting nor a client of its own (the connection it resumed counts)."""
        self._waiting.pop(key, None)

    def left(self, key: int) -> None:
        """The connection ended, however it ended."""
        self._waiting.pop(key, None)
        self._connected.discard(key)
