"""The `HostTransport` of a listening host: a socket connected to `codemode-host --listen`.

A `HostLink` runs the protocol over it exactly as over a spawned host's pipes. What differs
is what the far end is: the host is not ours to kill or reap (a failed link just closes the
socket, and the host frees the connection's sessions), a stream that ends means the host closed
the connection (or went away), and the hello carries this installation's codemode version and
the host's token.

Rules:
1. Connecting (and the TLS handshake) is bounded by `connect_timeout`; a host that cannot be
   reached raises `HostLostError` naming the address, never the token.
2. The socket is closed without a graceful TLS close: by the time a link is reaped its
   sessions are shut down or lost, and a host that vanished must not hold the reaper.
3. A cut connection is reached again on the same address (`reopen`): the link resumes it. A
   refused connect there (nothing listens) is `NothingListeningError`: the host is gone.
"""

from __future__ import annotations

import functools
import ssl
from importlib.metadata import PackageNotFoundError, version

import trio

from .._trio._sockets import HostAddress, connect
from .._wire import CONNECT_TIMEOUT, HostTransport, NothingListeningError
from ..errors import HostLostError


@functools.cache
def installed_version() -> str:
    """The codemode version of this installation (what the hello carries)."""
    try:
        return version("codemode")
    except PackageNotFoundError:  # pragma: no cover - run from a source tree
        return "unknown"


class SocketHost(HostTransport):
    """A connection to a host listening at `address`.

    Args:
        address: where the host listens.
        token: the host's shared secret (None: it needs none).
        ssl_context: TLS over the socket (None: plain).
        connect_timeout: rule 1.
        codemode_version: what the hello says (default: `installed_version()`).
    """

    closed_text = "code-mode host closed the connection"
    resumable = True

    def __init__(
        self,
        address: HostAddress,
        *,
        token: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        connect_timeout: float = CONNECT_TIMEOUT,
        codemode_version: str | None = None,
    ) -> None:
        self.address = address
        self.token = token
        self.codemode_version = codemode_version or installed_version()
        self._ssl_context = ssl_context
        self._connect_timeout = connect_timeout
        self._stream: trio.abc.Stream | None = None

    async def open(self) -> tuple[trio.abc.SendStream, trio.abc.ReceiveStream]:
        where = f"failed to connect to code-mode host {self.address}"
        try:
            with trio.fail_after(self._connect_timeout):
                self._stream = stream = await connect(self.address, ssl_context=self._ssl_context)
        except trio.TooSlowError:
            raise HostLostError(f"{where}: timed out after {self._connect_timeout} s") from None
        except trio.BrokenResourceError as error:  # the TLS handshake
            cause = error.__cause__ or error
            raise HostLostError(f"{where}: TLS handshake failed: {cause}") from error
        except OSError as error:
            raise HostLostError(f"{where}: {error.strerror or error}") from error
        return stream, stream

    async def reopen(self) -> tuple[trio.abc.SendStream, trio.abc.ReceiveStream]:
        await self.reap()
        try:
            return await self.open()
        except HostLostError as error:
            if _refused(error):
                raise NothingListeningError(str(error)) from error
            raise

    def describe(self, reason: str) -> str:
        return f"{reason} ({self.address})"

    async def reap(self) -> None:
        if self._stream is not None:
            await trio.aclose_forcefully(self._stream)  # rule 2


def _refused(error: BaseException) -> bool:
    """Nothing listens at the address (a refused TCP connect, a Unix socket's file gone):
    the host is gone, not the network path to it."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, ConnectionRefusedError | FileNotFoundError):
            return True
        if isinstance(seen, BaseExceptionGroup):
            return any(_refused(inner) for inner in seen.exceptions)
        seen = seen.__cause__
    return False
