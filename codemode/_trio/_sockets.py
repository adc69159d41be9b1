"""Host addresses and the sockets behind them: parsing, listening, connecting, keepalive.

Both ends use it: `codemode-host --listen ADDRESS` listens, the remote provider connects.

    tcp://HOST:PORT    TCP (HOST a name or an address, `[::1]` for IPv6; PORT 0 at --listen:
                       any free port)
    unix:PATH          a Unix socket (also `unix://PATH`); created with mode 0600

Rules:
1. An address with user-info (`tcp://user:secret@host:1`) is refused without echoing it: a
   token never travels in an address (design.md, host 7).
2. Every TCP connection, on both ends, has TCP keepalive on with short timers
   (`KEEPALIVE_IDLE`, `KEEPALIVE_INTERVAL`, `KEEPALIVE_COUNT`: a peer that vanished without a
   FIN or a reset is noticed after about 25 s) and `TCP_USER_TIMEOUT` (unacknowledged data
   gives up as soon), beside trio's `TCP_NODELAY`.
3. A Unix socket is bound under umask 0o177 (mode 0600, never wider, not even for an instant);
   a stale socket file that nobody listens on is replaced, any other file is refused.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import os
import socket
import ssl
import stat
import urllib.parse
from dataclasses import dataclass

import trio

KEEPALIVE_IDLE = 10
"""Seconds of silence before the first keepalive probe."""
KEEPALIVE_INTERVAL = 5
"""Seconds between probes."""
KEEPALIVE_COUNT = 3
"""Unanswered probes before the connection is dropped."""
USER_TIMEOUT_MS = (KEEPALIVE_IDLE + KEEPALIVE_INTERVAL * KEEPALIVE_COUNT) * 1000
LISTEN_BACKLOG = 128


@dataclass(frozen=True)
class HostAddress:
    """Where a host listens: `tcp` with `host` and `port`, or `unix` with `path`."""

    scheme: str
    host: str = ""
    port: int = 0
    path: str = ""

    def __str__(self) -> str:
        if self.scheme == "unix":
            return f"unix:{self.path}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"tcp://{host}:{self.port}"

    @property
    def is_loopback(self) -> bool:
        """Whether only this machine can reach it (a Unix socket, or a loopback TCP host)."""
        if self.scheme == "unix" or self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False


def parse_address(text: str) -> HostAddress:
    """The address `text` names.

    Raises:
        ValueError: a text that is not `tcp://HOST:PORT` or `unix:PATH` (rule 1: one with
            credentials is refused without echoing them).
    """
    if text.startswith("unix:"):
        path = text.removeprefix("unix:")
        path = path.removeprefix("//")
        if not path or "\0" in path:
            raise ValueError(f"a Unix socket address is unix:PATH, got {text!r}")
        return HostAddress("unix", path=path)
    if not text.startswith("tcp://"):
        raise ValueError(
            f"a code-mode host address is tcp://HOST:PORT or unix:PATH, got {_shown(text)!r}"
        )
    parts = urllib.parse.urlsplit(text)
    if "@" in parts.netloc:
        raise ValueError("a code-mode host address must not include credentials")
    try:
        port = parts.port
    except ValueError:
        port = None
    if not parts.hostname or port is None or parts.path or parts.query or parts.fragment:
        raise ValueError(f"a TCP host address is tcp://HOST:PORT, got {text!r}")
    return HostAddress("tcp", host=parts.hostname, port=port)


def _shown(text: str) -> str:
    """`text`, without what could be credentials (rule 1)."""
    _, at, tail = text.rpartition("@")
    return f"...@{tail}" if at else text


def keep_alive(sock: trio.socket.SocketType) -> None:
    """Rule 2, on a connected TCP socket (a Unix socket is left as it is)."""
    if sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (
        ("TCP_KEEPIDLE", KEEPALIVE_IDLE),
        ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL),
        ("TCP_KEEPCNT", KEEPALIVE_COUNT),
        ("TCP_USER_TIMEOUT", USER_TIMEOUT_MS),
    ):
        option = getattr(socket, name, None)
        if option is not None:  # Linux has them all
            sock.setsockopt(socket.IPPROTO_TCP, option, value)


async def open_listener(address: HostAddress) -> tuple[trio.SocketListener, HostAddress]:
    """Listen on `address`; the listener and the address it is bound to (the real port).

    Raises:
        OSError: the address cannot be bound (in use, no such interface, no permission).
    """
    if address.scheme == "unix":
        return await _listen_unix(address.path), address
    found = await trio.socket.getaddrinfo(
        address.host, address.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )
    family, kind, proto, _, where = found[0]
    sock = trio.socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        await sock.bind(where)
        sock.listen(LISTEN_BACKLOG)
    except BaseException:
        sock.close()
        raise
    host, port = sock.getsockname()[:2]
    return trio.SocketListener(sock), HostAddress("tcp", host=host, port=port)


async def _listen_unix(path: str) -> trio.SocketListener:
    await _remove_stale_socket(path)
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        previous = os.umask(0o177)  # rule 3: never wider than 0600
        try:
            await sock.bind(path)
        finally:
            os.umask(previous)
        sock.listen(LISTEN_BACKLOG)
    except BaseException:
        sock.close()
        raise
    return trio.SocketListener(sock)


async def _remove_stale_socket(path: str) -> None:
    """Rule 3: a socket file left by a host that died is replaced; a live one is in use."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise OSError(errno.EEXIST, f"{path} exists and is not a socket")
    probe = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with probe:
        try:
            await probe.connect(path)
        except ConnectionRefusedError:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            return
    raise OSError(errno.EADDRINUSE, f"a code-mode host already listens on unix:{path}")


async def connect(
    address: HostAddress, *, ssl_context: ssl.SSLContext | None = None
) -> trio.abc.Stream:
    """A stream connected to `address` (rule 2), over TLS with `ssl_context` (handshake done;
    the server name checked is the address's host, none for a Unix socket).

    Raises:
        OSError: the address cannot be reached.
        trio.BrokenResourceError: the TLS handshake failed (the `ssl` error is its cause).
    """
    stream: trio.abc.Stream
    if address.scheme == "unix":
        stream = await trio.open_unix_socket(address.path)
    else:
        tcp = await trio.open_tcp_stream(address.host, address.port)
        keep_alive(tcp.socket)
        stream = tcp
    if ssl_context is None:
        return stream
    name = address.host if address.scheme == "tcp" else None
    tls = trio.SSLStream(stream, ssl_context, server_hostname=name, https_compatible=False)
    try:
        await tls.do_handshake()
    except BaseException:
        await trio.aclose_forcefully(stream)
        raise
    return tls
