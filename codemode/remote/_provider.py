"""The remote provider: sessions over one or more listening hosts (`codemode-host --listen`).

The sessions, their generations and the provider's close are `codemode._wire`'s, shared with the
process provider; the listening hosts are this provider's placement strategy (`_hosts.py`:
placement, connections, the `resolve` hook), each reached through a `SocketHost`
(`_transport.py`).

Rules:
1. Leaving the block shuts every session down (bounded by `shutdown_timeout`; past it every
   connection is aborted), then closes every connection. The hosts keep running: they are
   not this provider's. An exception raised in the block leaves it as itself.
2. The application's delegate calls run as the process provider runs them (its rule 4).
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import trio

from .._api import CellLimits, Session, ToolThreadLimits, ToolThreadStatistics
from .._providers import ProviderStatistics
from .._trio import CLEANUP_GRACE, CallWorkers
from .._trio._sockets import parse_address
from .._wire import (
    CLOSE_TIMEOUT,
    CONNECT_TIMEOUT,
    HANDSHAKE_TIMEOUT,
    SHUTDOWN_TIMEOUT,
    WireSessions,
    open_wire_sessions,
)
from ..errors import check_platform
from ._hosts import RemoteHosts, Resolver

logger = logging.getLogger("codemode.remote")


class RemoteProvider:
    """Creates sessions served by listening hosts. Made by `open_remote_provider()`."""

    def __init__(self, sessions: WireSessions[RemoteHosts]) -> None:
        self._sessions = sessions
        self._hosts = sessions.placement

    @property
    def closed(self) -> bool:
        """True once the provider's block is being left."""
        return self._sessions.closed

    @property
    def addresses(self) -> list[str]:
        """The hosts' addresses, in the order given."""
        return self._hosts.addresses

    def statistics(self) -> ProviderStatistics:
        """The provider's hosts (for each: its address, its sessions and its cells), its
        sessions, cells and tool threads."""
        return self._sessions.statistics()

    def tool_thread_statistics(self) -> ToolThreadStatistics:
        """What the threads of the sessions' sync tools hold now (`docs/limits.md`)."""
        return self._sessions.tool_thread_statistics()

    def placement(self) -> dict[str, int]:
        """The live sessions of this provider on each host, by address."""
        return self._hosts.placement()

    async def create_session(
        self,
        limits: CellLimits | None = None,
        *,
        store_load: bool = True,
        keep_stored_values: bool = False,
    ) -> Session:
        """A new session, opened at once on the least-loaded host that takes it.

        Raises:
            InvalidRequestError: invalid limits.
            AdmissionError: every reachable host refused it for admission.
            HostLostError: no host could be reached (the text names each one's failure).
            ProviderClosedError: the provider is closed.
        """
        return await self._sessions.create(
            limits, store_load=store_load, keep_stored_values=keep_stored_values
        )


@asynccontextmanager
async def open_remote_provider(
    addresses: Sequence[str],
    *,
    token: str | None = None,
    ssl_context: ssl.SSLContext | None = None,
    handshake_timeout: float = HANDSHAKE_TIMEOUT,
    connect_timeout: float = CONNECT_TIMEOUT,
    shutdown_timeout: float = SHUTDOWN_TIMEOUT,
    resolve: Resolver | None = None,
    tool_threads: ToolThreadLimits | None = None,
) -> AsyncIterator[RemoteProvider]:
    """A provider whose sessions run in hosts listening at `addresses`, for the block.

    Args:
        addresses: `tcp://HOST:PORT` or `unix:PATH` of each host (`codemode-host --listen`).
        token: the hosts' shared secret (their `--token-file` or `CODEMODE_HOST_TOKEN`).
        ssl_context: TLS for every connection (hosts started with `--tls-cert`/`--tls-key`),
            e.g. `ssl.create_default_context(cafile=...)`; for a Unix socket the context must
            not check host names.
        handshake_timeout: seconds a host has to answer the hello.
        connect_timeout: seconds to reach a host (TCP connect and TLS handshake).
        shutdown_timeout: seconds the exit waits for the sessions' shutdowns before it aborts
            the connections.
        resolve: `await resolve(index)` gives the current address of the host given as
            `addresses[index]`; asked before every reconnection to it (`_hosts.py`, rule 2),
            for hosts whose address changes when they restart. It raises `HostLostError` when
            the host cannot be found.
        tool_threads: the threads the sessions' sync tools run in (default
            `ToolThreadLimits()`; `docs/limits.md`).

    Resource handling: connections are opened on first use; leaving the block shuts every
    session down and closes every connection, shielded and bounded; delegate calls that
    ignore cancellation are abandoned (logged) after the cleanup grace. The hosts keep
    running.

    Error handling: an exception raised in the block leaves it as itself. An address that
    does not parse raises `ValueError` on entry; on a system other than Linux, entering the
    block raises `UnsupportedPlatformError`.
    """
    check_platform()
    if not addresses:
        raise ValueError("open_remote_provider needs at least one host address")
    parsed = [parse_address(address) for address in addresses]

    def hosts(nursery: trio.Nursery, workers: CallWorkers) -> RemoteHosts:
        return RemoteHosts(
            parsed,
            nursery,
            workers,
            token=token,
            ssl_context=ssl_context,
            handshake_timeout=handshake_timeout,
            connect_timeout=connect_timeout,
            resolve=resolve,
        )

    async with open_wire_sessions(
        hosts,
        tool_threads=tool_threads,
        shutdown_timeout=shutdown_timeout,
        close_bound=shutdown_timeout + 2 * (CLOSE_TIMEOUT + CLEANUP_GRACE),
        logger=logger,
        kind="remote",
    ) as sessions:
        yield RemoteProvider(sessions)
