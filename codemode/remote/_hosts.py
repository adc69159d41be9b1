"""The remote provider's placement strategy: listening hosts, one connection per address
(`codemode._wire`'s `Placement`).

One connection per host address, opened on first use and shared by the sessions placed there;
each connection has its own sessions and admission limits on the host. A lost connection is a
lost host: its sessions fail what was in flight, and each re-opens on a fresh connection (to
that host or another) with its next operation, which raises `RuntimeReplacedError` once (this
strategy announces replacements: `_wire/_generations.py`, rule 1; design.md, host 7).

Rules:
1. Placement: a new (or re-opened) session goes to the host holding the fewest of this
   provider's live sessions (counting those being opened there, so sessions created at once
   spread too), ties broken by the order of `addresses`; a host that could not be reached
   within `RETRY_AFTER` seconds is tried last. Unreachable hosts, hosts that refuse the
   session for admission (`AdmissionError`), and hosts lost while it opens are skipped and the
   next one tried. Only the opening is retried: established work is never replayed.
2. One connection attempt per host at a time (a lock per host); a live connection is reused.
   With a `resolve` hook, every attempt after a host's first (its connection was lost, or an
   attempt failed) first asks the hook for the host's current address, bounded by
   `connect_timeout`: a host a cluster scheduler restarted elsewhere (`codemode.ray`) is
   found where it is now. A hook that fails (`HostLostError`, or too slow) fails the attempt.
3. A session counts on a host while it is open on that host's live connection: a connection
   lost, or replaced by a new one, counts none of the sessions opened on it.
4. Closing: the hosts keep running (they are not this provider's); every connection is closed.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Awaitable, Callable, Hashable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import trio

from .._providers import HostLoad
from .._trio import CallWorkers
from .._trio._sockets import HostAddress, parse_address
from .._wire import HostLink
from ..errors import AdmissionError, HostLostError, ProviderClosedError
from ._transport import SocketHost

logger = logging.getLogger("codemode.remote")

RETRY_AFTER = 5.0
"""Seconds a host that could not be reached is tried after the others (rule 1)."""

Resolver = Callable[[int], Awaitable[str]]
"""A host's current address, from its index in `addresses` (rule 2)."""

_Opened = TypeVar("_Opened")


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

    @property
    def live_link(self) -> HostLink | None:
        link = self.link
        return link if link is not None and link.alive else None


class RemoteHosts:
    """The listening hosts of one remote provider. Made by `open_remote_provider`; every link
    runs in the provider's nursery.

    Args:
        addresses: where the hosts listen, in the order ties are broken.
        nursery: the provider's nursery.
        workers: where the links run the application's delegate calls.
        token, ssl_context, handshake_timeout, connect_timeout: each connection's.
        resolve: rule 2.
    """

    def __init__(
        self,
        addresses: list[HostAddress],
        nursery: trio.Nursery,
        workers: CallWorkers,
        *,
        token: str | None,
        ssl_context: ssl.SSLContext | None,
        handshake_timeout: float,
        connect_timeout: float,
        resolve: Resolver | None,
    ) -> None:
        self._hosts = [_Host(index, address) for index, address in enumerate(addresses)]
        self._nursery = nursery
        self._workers = workers
        self._token = token
        self._ssl_context = ssl_context
        self._handshake_timeout = handshake_timeout
        self._connect_timeout = connect_timeout
        self._resolve = resolve
        self._placed: dict[Hashable, tuple[_Host, HostLink]] = {}
        """Each open session's host and the connection it was opened on (rule 3)."""
        self._connected = 0
        self.closed = False

    @property
    def announces_replacement(self) -> bool:
        return True

    @property
    def spawned(self) -> int:
        """Connections made (a reconnection to the same host counts again)."""
        return self._connected

    @property
    def retired(self) -> int:
        return 0  # an idle connection is kept

    @property
    def addresses(self) -> list[str]:
        """The hosts' current addresses, in the order given."""
        return [str(host.address) for host in self._hosts]

    def placement(self) -> dict[str, int]:
        """The live sessions on each host, by current address (rule 3)."""
        return {str(host.address): self._load(host) for host in self._hosts}

    def hosts(self) -> tuple[HostLoad, ...]:
        return tuple(
            HostLoad(
                index=host.index,
                pid=None,
                sessions=self._load(host),
                cells=link.statistics().cells if (link := host.live_link) is not None else 0,
                address=str(host.address),
            )
            for host in self._hosts
        )

    def _load(self, host: _Host) -> int:
        """Rule 3, and the sessions being opened there (rule 1)."""
        link = host.live_link
        if link is None:
            return host.opening
        placed = sum(1 for on, by in self._placed.values() if on is host and by is link)
        return host.opening + placed

    # ---- placement (rule 1) ----------------------------------------------------------------

    async def place(
        self, session: Hashable, open_on: Callable[[HostLink], Awaitable[_Opened]]
    ) -> _Opened:
        """Open `session` on the least-loaded host that takes it.

        Raises:
            AdmissionError: every reachable host refused it for admission.
            HostLostError: no host could be reached (the text names each one's failure).
            ProviderClosedError: the provider is closed.
        """
        self._placed.pop(session, None)
        failures: list[str] = []
        refusal: AdmissionError | None = None
        for host in self._ranked():
            with self._placing(host):
                try:
                    link = await self._connect(host)
                except HostLostError as error:
                    failures.append(str(error))
                    continue
                try:
                    opened = await open_on(link)
                except AdmissionError as error:
                    refusal = error
                    continue
                except HostLostError as error:
                    if link.alive:
                        raise
                    failures.append(str(error))
                    continue
                self._placed[session] = (host, link)
                return opened
        if refusal is not None:
            raise refusal
        raise HostLostError("no code-mode host could open the session: " + "; ".join(failures))

    def leave(self, session: Hashable) -> None:
        self._placed.pop(session, None)

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

    # ---- connections (rule 2) --------------------------------------------------------------

    async def _connect(self, host: _Host) -> HostLink:
        """The live connection to `host`, made if there is none.

        Raises:
            HostLostError: the host cannot be reached, or refused the handshake.
            ProviderClosedError: the provider is closed.
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
            self._connected += 1
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

    # ---- closing (rule 4) ------------------------------------------------------------------

    def _links(self) -> list[HostLink]:
        return [host.link for host in self._hosts if host.link is not None]

    def abort(self, reason: str) -> None:
        for link in self._links():
            link.abort(reason)

    async def aclose(self) -> None:
        self.closed = True
        async with trio.open_nursery() as closing:
            for link in self._links():
                closing.start_soon(link.aclose)
