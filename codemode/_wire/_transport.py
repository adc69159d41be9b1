"""How a `HostLink` reaches its host: the byte streams, and what the far end looks like.

A `HostLink` (`_link.py`) runs the protocol over whatever a `HostTransport` opens: a spawned
host's stdin and stdout (`SpawnedHost`, `codemode.process`), or a socket connected to a
listening host (`SocketHost`, `codemode.remote`). The link owns the protocol, its tasks and its
failure; the transport owns the resource behind the streams (a child process, a socket) and
says what its end means: why a stream ended, what a failed start looked like, how to let go of
it.

Rules:
1. `open` is called once, before anything else; a transport that cannot open raises
   `HostLostError` with a text that says where it tried.
2. `reap` is called once, shielded, after the link's tasks ended (also when `open` succeeded
   and the handshake failed): no process, fd or socket outlives it.
3. What goes into the hello beside versions and capabilities (`codemode_version`, `token`)
   is the transport's: a spawned host of the same installation needs neither, and its frames
   are the same as before they existed.
4. A transport that can reach its host again (`resumable`: a socket) lets the link resume a
   cut connection: `reopen` lets go of the old streams and opens new ones (rule 1's errors).
   A spawned host's pipes cannot be cut without the host going with them.
"""

from __future__ import annotations

import abc
from collections.abc import Callable

import trio

from ..errors import HostLostError

DRAIN_TIMEOUT = 1.0
"""Seconds to read what an exited host left in its stdout pipe (`_link_core.py`, rule 2)."""
CONNECT_TIMEOUT = 10.0
"""Seconds to reach a listening host (TCP connect, and the TLS handshake if any)."""
PARENT_VARIABLE = "CODEMODE_HOST_PARENT"
"""The environment variable naming the process a host it started dies with (the host watches
that process: `host/__main__.py`, `host/_listen.py`)."""


class NothingListeningError(HostLostError):
    """`reopen` found nothing listening where the host was: it is gone, and a resume would
    wait for nothing (rule 4)."""


class HostTransport(abc.ABC):
    """Where a host link's bytes come from and go to."""

    codemode_version: str | None = None
    """Sent in the hello (None: not sent)."""
    token: str | None = None
    """The host's shared secret, sent in the hello (None: not sent)."""
    closed_text: str = "code-mode host closed its stdout"
    """Why operations fail once the host's stream ended, before the reason is known."""
    resumable: bool = False
    """Rule 4: `reopen` can reach the same host again."""

    @abc.abstractmethod
    async def open(self) -> tuple[trio.abc.SendStream, trio.abc.ReceiveStream]:
        """Start or reach the host; the stream the client writes and the one it reads.

        Raises:
            HostLostError: the host cannot be started or reached.
        """

    async def reopen(self) -> tuple[trio.abc.SendStream, trio.abc.ReceiveStream]:
        """Rule 4: let go of the streams `open` (or the last `reopen`) gave and reach the host
        again.

        Raises:
            HostLostError: the host cannot be reached (or the transport cannot reopen).
        """
        raise HostLostError("code-mode host transport cannot reconnect")

    @property
    def pid(self) -> int | None:
        """The host process's id, when this transport started it (None otherwise)."""
        return None

    def start(
        self, nursery: trio.Nursery, lost: Callable[[str], None], read_done: trio.Event
    ) -> None:
        """Start the transport's own tasks in the link's nursery (none by default). `lost`
        reports a failure to the link; `read_done` is set once the link read to the end."""
        return

    def exit_status(self) -> int | None:
        """The host's exit status if it is known to have exited (a handshake failure names
        it), else None."""
        return None

    def describe(self, reason: str) -> str:
        """`reason`, with whatever explains it (a spawned host's last stderr lines)."""
        return reason

    async def last_words(self) -> None:
        """Wait until `describe` has all it will get (the caller bounds the wait)."""
        await trio.lowlevel.checkpoint()

    def kill(self) -> None:
        """The link failed: stop the host now if the transport owns it (nothing by default:
        the link's reader ends with the link and `reap` lets go of the streams)."""
        return

    async def close(self) -> None:
        """Let the host end gracefully: called once the sessions are shut down, bounded by
        the caller (nothing by default)."""
        await trio.lowlevel.checkpoint()

    async def ended(self) -> str:
        """The link read the host's stream to its end: why (bounded)."""
        await trio.lowlevel.checkpoint()
        return self.closed_text

    @abc.abstractmethod
    async def reap(self) -> None:
        """Release everything `open` acquired (rule 2)."""
