"""The remote provider: sessions over one or more listening hosts (`codemode-host --listen`).

One connection per host address, opened on first use and shared by the sessions placed there;
each connection has its own sessions and admission limits on the host. A lost connection is a
lost host: its sessions fail what was in flight, and each reopens on a fresh connection (to
that host or another) with its next operation, which raises `RuntimeReplacedError` once
(`_session.py`).

Rules:
1. Placement: a new (or reopened) session goes to the host holding the fewest of this
   provider's live sessions (counting those being opened there, so sessions created at once
   spread too), ties broken by the order of `addresses`; a host that could not be reached
   within `RETRY_AFTER` seconds is tried last. Unreachable hosts, and hosts that refuse the
   session for admission, are skipped.
2. One connection attempt per host at a time (a lock per host); a live connection is reused.
   With a `resolve` hook, every attempt after a host's first (its connection was lost, or an
   attempt failed) first asks the hook for the host's current address, bounded by
   `connect_timeout`: a host a cluster scheduler restarted elsewhere (`codemode.ray`) is
   found where it is now. A hook that fails (`HostLostError`, or too slow) fails the attempt.
3. Leaving the block shuts every session down (bounded by `shutdown_timeout`; past it every
   connection is aborted), then closes every connection. The hosts keep running: they are
   not this provider's. An exception raised in the block leaves it as itself.
"""

from __future__ import annotations

import itertools
import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager

import trio

from .._api import CellLimits, ToolThreadLimits, ToolThreadStatistics
from .._tool_threads import ToolThreads, use_tool_threads
from .._trio import CLEANUP_GRACE, CallWorkers, open_detached_nursery, open_service_nursery
from .._trio._sockets import HostAddress, parse_address
from .._wire import (
    CLOSE_TIMEOUT,
    CONNECT_TIMEOUT,
    HANDSHAKE_TIMEOUT,
    LINK_WORKERS,
    HostLink,
    ProcessSession,
)
from ..errors import HostLostError, ProviderClosedError, check_platform
from ..process._provider import SHUTDOWN_TIMEOUT
from ._session import RemoteSession
from ._transport import SocketHost

logger = logging.getLogger("codemode.remote")

RETRY_AFTER = 5.0
"""Seconds a host that could not be reached is tried after the others (rule 1)."""

Resolver = Callable[[int], Awaitable[str]]
"""A host's current address, from its index in `addresses` (rule 2)."""


class _Host:
    """One address and its current connection."""

    def __init__(self, index: int, address: HostAddress) -> None:
        self.index = index
        self.address = address
        self.link: HostLink | None = None
        self.lock = trio.Lock()
        self.failed_at: float | None = None
        self.opening = 0
        """Sessions being placed here right now (rule 1)."""


class RemoteProvider:
    """Creates sessions served by listening hosts. Made by `open_remote_provider()`."""

    def __init__(
        self,
        addresses: list[HostAddress],
        nursery: trio.Nursery,
        *,
        token: str | None,
        ssl_context: ssl.SSLContext | None,
        handshake_timeout: float,
        connect_timeout: float,
        resolve: Resolver | None,
        calls: trio.Nursery,
        tool_threads: ToolThreads,
    ) -> None:
        self._hosts = [_Host(index, address) for index, address in enumerate(addresses)]
        self._nursery = nursery
        self._tool_threads = tool_threads
        # The application's delegate calls, as the process provider runs them (its rule 4).
        self._workers = CallWorkers(calls, keep=LINK_WORKERS)
        use_tool_threads(self._workers.context, self._tool_threads)
        self._token = token
        self._ssl_context = ssl_context
        self._handshake_timeout = handshake_timeout
        self._connect_timeout = connect_timeout
        self._resolve = resolve
        self._session_ids = itertools.count(1)
        self._sessions: set[RemoteSession] = set()
        self.closed = False

    @property
    def addresses(self) -> list[str]:
        """The hosts' addresses, in the order given."""
        return [str(host.address) for host in self._hosts]

    def tool_thread_statistics(self) -> ToolThreadStatistics:
        """What the threads of the sessions' sync tools hold now (`docs/limits.md`)."""
        return self._tool_threads.statistics()

    def placement(self) -> dict[str, int]:
        """The live sessions of this provider on each host, by address."""
        return {str(host.address): self._load(host) for host in self._hosts}

    async def create_session(
        self, limits: CellLimits | None = None, *, store_load: bool = True
    ) -> RemoteSession:
        """A new session, opened at once on the least-loaded host that takes it.

        Raises:
            InvalidRequestError: invalid limits.
            AdmissionError: every reachable host refused it for admission.
            HostLostError: no host could be reached (the text names each one's failure).
            ProviderClosedError: the provider is closed.
        """
        if self.closed:
            raise ProviderClosedError()
        limits = (limits or CellLimits()).checked()
        session = RemoteSession(self, limits, store_load=store_load)
        self._sessions.add(session)
        try:
            await session._bind()
        except BaseException:
            self._sessions.discard(session)
            raise
        return session

    # ---- what sessions use -----------------------------------------------------------------

    def _forget(self, session: ProcessSession) -> None:
        if isinstance(session, RemoteSession):
            self._sessions.discard(session)

    def _next_session_id(self) -> str:
        return f"session-{next(self._session_ids)}"

    def _load(self, host: _Host) -> int:
        link = host.link
        if link is None or not link.alive:
            return host.opening
        return host.opening + sum(1 for s in self._sessions if s._live_link is link)

    @contextmanager
    def _placing(self, host: _Host) -> Iterator[None]:
        """A session is being opened on `host`: it counts in its load meanwhile (rule 1)."""
        host.opening += 1
        try:
            yield
        finally:
            host.opening -= 1

    def _ranked(self) -> list[_Host]:
        """The hosts in the order a session tries them (rule 1)."""
        now = trio.current_time()

        def rank(host: _Host) -> tuple[bool, int, int]:
            failed = host.failed_at is not None and now - host.failed_at < RETRY_AFTER
            return failed, self._load(host), host.index

        return sorted(self._hosts, key=rank)

    async def _connect(self, host: _Host) -> HostLink:
        """The live connection to `host`, made if there is none (rule 2).

        Raises:
            HostLostError: the host cannot be reached, or refused the handshake.
        """
        async with host.lock:
            if self.closed:
                raise ProviderClosedError()
            if host.link is not None and host.link.alive:
                return host.link
            if self._resolve is not None and (host.link is not None or host.failed_at is not None):
                await self._resolved(host)
            transport = SocketHost(
                host.address,
                token=self._token,
                ssl_context=self._ssl_context,
                connect_timeout=self._connect_timeout,
            )
            link = HostLink(transport, self._handshake_timeout, workers=self._workers)
            try:
                await self._nursery.start(link.run)
            except HostLostError as error:
                host.failed_at = trio.current_time()
                logger.info("code-mode host %s is unreachable: %s", host.address, error)
                raise
            host.failed_at = None
            host.link = link
            return link

    async def _resolved(self, host: _Host) -> None:
        """Rule 2: move `host` to the address the hook gives now."""
        assert self._resolve is not None
        try:
            with trio.fail_after(self._connect_timeout):
                address = parse_address(await self._resolve(host.index))
        except (HostLostError, trio.TooSlowError, ValueError) as error:
            host.failed_at = trio.current_time()
            text = str(error) or f"timed out after {self._connect_timeout} s"
            logger.info("cannot resolve code-mode host %s: %s", host.address, text)
            raise HostLostError(f"cannot resolve code-mode host {host.address}: {text}") from error
        if address != host.address:
            logger.info("code-mode host %s moved to %s", host.address, address)
            host.address = address

    async def _link(self, session: ProcessSession) -> HostLink:
        """A connection to the first host of the ranking that can be reached (`session`, any
        of this provider's, places itself: `RemoteSession._place`)."""
        failures: list[str] = []
        for host in self._ranked():
            try:
                return await self._connect(host)
            except HostLostError as error:
                failures.append(str(error))
        raise HostLostError("no code-mode host could be reached: " + "; ".join(failures))

    # ---- closing ---------------------------------------------------------------------------

    def _links(self) -> list[HostLink]:
        return [host.link for host in self._hosts if host.link is not None]

    async def _close(self, shutdown_timeout: float) -> None:
        """Rule 3."""
        self.closed = True
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._abort_after, shutdown_timeout)
                async with trio.open_nursery() as shutdowns:
                    for session in list(self._sessions):
                        shutdowns.start_soon(_shut_down_quietly, session)
                nursery.cancel_scope.cancel()
        finally:
            async with trio.open_nursery() as closing:
                for link in self._links():
                    closing.start_soon(link.aclose)

    async def _abort_after(self, seconds: float) -> None:
        await trio.sleep(seconds)
        for link in self._links():
            link.abort("timed out shutting down the code-mode host's sessions")


async def _shut_down_quietly(session: RemoteSession) -> None:
    try:
        await session.shutdown()
    except Exception:  # the provider closes whatever one session says; the session knows
        logger.exception("shutting a code-mode session down failed")


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
            `addresses[index]`; asked before every reconnection to it (rule 2), for hosts
            whose address changes when they restart. It raises `HostLostError` when the host
            cannot be found.
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
    threads = ToolThreads(tool_threads)
    async with (
        open_detached_nursery(bound=CLEANUP_GRACE) as calls,
        open_service_nursery() as nursery,
    ):
        provider = RemoteProvider(
            parsed,
            nursery,
            token=token,
            ssl_context=ssl_context,
            handshake_timeout=handshake_timeout,
            connect_timeout=connect_timeout,
            resolve=resolve,
            calls=calls,
            tool_threads=threads,
        )
        try:
            yield provider
        finally:
            bound = shutdown_timeout + 2 * (CLOSE_TIMEOUT + CLEANUP_GRACE)
            with trio.CancelScope(shield=True), trio.move_on_after(bound):
                await provider._close(shutdown_timeout)
            nursery.cancel_scope.cancel()
